//! One JSONL data line into a document: pre-tokenized `input_ids` (+ `loss_mask`), `text`
//! through the target's tokenizer.json, or chat `messages` through the tokenizer's own chat
//! template.

use super::chat::{assistant_spans, ChatOptions, ChatTemplate, TurnMarks};
use crate::engine::data::Doc;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// Turns a text or chat line into a document (and, for `generate`, a prompt into ids).
pub struct TextTokenizer {
    tok: tokenizers::Tokenizer,
    /// The model directory's own chat template, when it has one, and where its assistant
    /// turns start and end (None when the template's turns cannot be told apart).
    template: Option<(ChatTemplate, Result<TurnMarks, String>)>,
    /// The directory of tokenizer.json, for messages.
    dir: PathBuf,
}

impl TextTokenizer {
    pub fn open(path: &Path) -> Result<TextTokenizer> {
        TextTokenizer::open_with(path, ChatOptions::default())
    }

    /// The tokenizer of `path`, its directory's chat template rendering with `chat`.
    pub fn open_with(path: &Path, chat: ChatOptions) -> Result<TextTokenizer> {
        let tok = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read tokenizer {}: {e}; text data needs the target's tokenizer.json",
                path.display()
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let template = ChatTemplate::find(&dir)?.map(|t| {
            let t = t.with_options(chat);
            let marks = t.turn_marks().map_err(|e| format!("{e:#}"));
            (t, marks)
        });
        Ok(TextTokenizer { tok, template, dir })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    fn text(&self, text: &str) -> Result<Doc> {
        let ids = self.encode(text)?;
        Ok(Doc {
            loss_mask: vec![true; ids.len()],
            ids,
        })
    }

    /// A conversation through the tokenizer's chat template, tokenized whole; the loss mask
    /// covers the tokens of the assistant turns as rendered (`chat::assistant_spans`). A span's
    /// first token is the count of tokens of the text before it, its end the count up to its
    /// end, so a token is never split between prompt and reply (SpecForge maps them so too).
    fn chat(&self, messages: &[serde_json::Value]) -> Result<Doc> {
        let (template, marks) = self.template_and_marks()?;
        let marks = marks.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        let text = template.render(messages)?;
        let ids = self.encode(&text)?;
        let mut loss_mask = vec![false; ids.len()];
        for span in assistant_spans(&text, marks) {
            let start = self.encode(&text[..span.start])?.len().min(ids.len());
            let end = self.encode(&text[..span.end])?.len().min(ids.len());
            loss_mask[start..end.max(start)].fill(true);
        }
        Ok(Doc { ids, loss_mask })
    }

    /// The chat template chat data goes through; a tokenizer without one refuses chat data (a
    /// hand-written format would train the drafter on text its target never sees).
    pub fn chat_template(&self) -> Result<&ChatTemplate> {
        Ok(&self.template_and_marks()?.0)
    }

    fn template_and_marks(&self) -> Result<&(ChatTemplate, Result<TurnMarks, String>)> {
        self.template.as_ref().with_context(|| {
            let dir = self.dir.display();
            format!(
                "chat data (`messages`) needs the tokenizer's chat template, and the tokenizer \
                 in {dir} has none (no `chat_template` in {dir}/tokenizer_config.json, no \
                 {dir}/chat_template.jinja): give a tokenizer with a chat_template, or \
                 pre-tokenized `input_ids` + `loss_mask` lines"
            )
        })
    }
}

/// Whether a line needs the tokenizer (`text` or `messages`, no `input_ids`).
pub fn needs_tokenizer(v: &serde_json::Value) -> bool {
    v.get("input_ids").is_none() && (v.get("text").is_some() || v.get("messages").is_some())
}

/// The document of one parsed line. `tok` is asked for only when the line is text or chat.
pub fn line_doc<'t>(
    v: &serde_json::Value,
    vocab_size: i64,
    tok: impl FnOnce() -> Result<&'t TextTokenizer>,
) -> Result<Doc> {
    if let Some(ids) = v.get("input_ids") {
        return ids_doc(ids, v.get("loss_mask"), vocab_size);
    }
    if !needs_tokenizer(v) {
        bail!("no `input_ids`, `text` or `messages`: each line needs one");
    }
    let t = tok()?;
    let doc = match (
        v.get("text").and_then(|x| x.as_str()),
        v.get("messages").and_then(|x| x.as_array()),
    ) {
        (Some(s), _) => t.text(s)?,
        (None, Some(m)) => t.chat(m)?,
        _ => bail!("`text` must be a string and `messages` a list"),
    };
    if let Some(bad) = doc.ids.iter().find(|&&i| i >= vocab_size) {
        bail!("the tokenizer gave id {bad}, outside the target's vocabulary ({vocab_size})");
    }
    Ok(doc)
}

fn ids_doc(
    ids: &serde_json::Value,
    mask: Option<&serde_json::Value>,
    vocab_size: i64,
) -> Result<Doc> {
    let ids: Vec<i64> = ids
        .as_array()
        .context("`input_ids` must be an array")?
        .iter()
        .map(|x| x.as_i64().filter(|t| (0..vocab_size).contains(t)))
        .collect::<Option<_>>()
        .with_context(|| format!("`input_ids` must be integers in 0..{vocab_size}"))?;
    let loss_mask = match mask.and_then(|x| x.as_array()) {
        None => vec![true; ids.len()],
        Some(m) => {
            if m.len() != ids.len() {
                bail!(
                    "`loss_mask` has {} entries but `input_ids` has {}",
                    m.len(),
                    ids.len()
                );
            }
            m.iter()
                .map(|x| x.as_bool().unwrap_or(x.as_i64().unwrap_or(0) != 0))
                .collect()
        }
    };
    Ok(Doc { ids, loss_mask })
}
