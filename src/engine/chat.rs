//! Chat data through the tokenizer's own chat template (Jinja, rendered with minijinja the way
//! transformers renders it: `trim_blocks`, `lstrip_blocks`, Python string methods), and the
//! loss mask over the assistant turns of the rendered text.

use anyhow::{Context, Result};
use std::ops::Range;
use std::path::Path;

/// A model directory's chat template: `chat_template` of tokenizer_config.json (a string, or a
/// list of `{name, template}` of which `default` is taken), else `chat_template.jinja`.
pub struct ChatTemplate {
    source: String,
    /// Where it came from, for messages.
    origin: String,
    bos_token: String,
    eos_token: String,
}

fn token_text(v: Option<&serde_json::Value>) -> String {
    match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .unwrap_or_default()
            .to_string(),
        None => String::new(),
    }
}

impl ChatTemplate {
    /// The template of the directory, or None when it has none.
    pub fn find(dir: &Path) -> Result<Option<ChatTemplate>> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", cfg_path.display()))?,
            Err(_) => serde_json::Value::Null,
        };
        let from_config = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = match from_config {
            Some(s) => (s, cfg_path.display().to_string()),
            None if jinja.is_file() => (
                std::fs::read_to_string(&jinja)
                    .with_context(|| format!("cannot read {}", jinja.display()))?,
                jinja.display().to_string(),
            ),
            None => return Ok(None),
        };
        Ok(Some(ChatTemplate {
            source,
            origin,
            bos_token: token_text(cfg.get("bos_token")),
            eos_token: token_text(cfg.get("eos_token")),
        }))
    }

    /// The whole conversation as text (no generation prompt).
    pub fn render(&self, messages: &[serde_json::Value]) -> Result<String> {
        self.render_with(messages, false)
    }

    /// The conversation followed by the template's generation prompt (the start of an
    /// assistant turn): what a model continues.
    pub fn render_prompt(&self, messages: &[serde_json::Value]) -> Result<String> {
        self.render_with(messages, true)
    }

    fn render_with(&self, messages: &[serde_json::Value], generation: bool) -> Result<String> {
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        let bad = |e: minijinja::Error| anyhow::anyhow!("chat template of {}: {e}", self.origin);
        env.add_template("chat", &self.source).map_err(bad)?;
        let tmpl = env.get_template("chat").map_err(bad)?;
        tmpl.render(minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
            add_generation_prompt => generation,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        })
        .map_err(bad)
    }
}

/// Byte ranges of the assistant turns in the rendered text: each assistant message's content
/// (as the template wrote it: trimmed), found in order, plus a special token that directly
/// follows it (`<|im_end|>`): our reading of "loss mask = assistant turns". A content the template rewrote beyond trimming is not found and carries
/// no loss.
pub fn assistant_spans(
    text: &str,
    messages: &[serde_json::Value],
    specials: &[String],
) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut cursor = 0;
    for m in messages {
        let role = m.get("role").and_then(|r| r.as_str());
        let content = m.get("content").and_then(|c| c.as_str()).map(str::trim);
        let (Some("assistant"), Some(content)) = (role, content) else {
            if let Some(c) = content.filter(|c| !c.is_empty()) {
                // Skip past other turns so that an assistant text quoted earlier is not taken.
                if let Some(at) = text[cursor..].find(c) {
                    cursor += at + c.len();
                }
            }
            continue;
        };
        if content.is_empty() {
            continue;
        }
        let Some(at) = text[cursor..].find(content) else {
            continue;
        };
        let start = cursor + at;
        let mut end = start + content.len();
        if let Some(s) = specials
            .iter()
            .find(|s| text[end..].starts_with(s.as_str()))
        {
            end += s.len();
        }
        out.push(start..end);
        cursor = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_assistant_content_and_its_end_token() {
        let msgs: Vec<serde_json::Value> = serde_json::from_str(
            r#"[{"role": "user", "content": "say ok"}, {"role": "assistant", "content": " ok "},
                {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "yes"}]"#,
        )
        .unwrap();
        let text = "<s>U: say ok</s>A: ok</s>U: ok?</s>A: yes</s>";
        let spans = assistant_spans(text, &msgs, &["</s>".to_string()]);
        let got: Vec<&str> = spans.iter().map(|r| &text[r.clone()]).collect();
        assert_eq!(got, vec!["ok</s>", "yes</s>"]);
    }
}
