//! Chat data through the tokenizer's own chat template (Jinja, rendered with minijinja the way
//! transformers renders it: `trim_blocks`, `lstrip_blocks`, Python string methods), and the
//! loss mask over the assistant turns as the template renders them (SpecForge's rule: from the
//! end of each assistant header through the end of its turn, reasoning included).

use anyhow::{Context, Result};
use serde::Deserialize;
use std::ops::Range;
use std::path::Path;

/// How conversations are rendered: the `[chat]` table of the TOML file.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatOptions {
    /// Passed to the template as `enable_thinking` (Qwen3's switch); unset: the template's own
    /// default.
    pub enable_thinking: Option<bool>,
    /// A system message put first in every conversation that does not start with one.
    pub system_prompt: Option<String>,
}

impl ChatOptions {
    /// The conversation as the template is given it: the system prompt first where it applies;
    /// with thinking off, no `reasoning_content` (as SpecForge's non-thinking parser keeps only
    /// role, content and tool calls).
    fn prepare(&self, messages: &[serde_json::Value]) -> Vec<serde_json::Value> {
        let has_system = messages
            .first()
            .and_then(|m| m.get("role"))
            .and_then(|r| r.as_str())
            == Some("system");
        let mut out = Vec::with_capacity(messages.len() + 1);
        if let (Some(p), false) = (&self.system_prompt, has_system) {
            out.push(serde_json::json!({"role": "system", "content": p}));
        }
        out.extend_from_slice(messages);
        if self.enable_thinking == Some(false) {
            for m in &mut out {
                if let Some(m) = m.as_object_mut() {
                    m.remove("reasoning_content");
                }
            }
        }
        out
    }
}

/// A model directory's chat template: `chat_template` of tokenizer_config.json (a string, or a
/// list of `{name, template}` of which `default` is taken), else `chat_template.jinja`.
pub struct ChatTemplate {
    source: String,
    /// Where it came from, for messages.
    origin: String,
    bos_token: String,
    eos_token: String,
    options: ChatOptions,
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
            options: ChatOptions::default(),
        }))
    }

    /// The same template rendering with `options`.
    pub fn with_options(self, options: ChatOptions) -> ChatTemplate {
        ChatTemplate { options, ..self }
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
        let messages = self.options.prepare(messages);
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
        let ctx = minijinja::context! {
            messages => minijinja::Value::from_serialize(&messages),
            add_generation_prompt => generation,
            bos_token => self.bos_token.clone(),
            eos_token => self.eos_token.clone(),
        };
        let ctx = match self.options.enable_thinking {
            Some(on) => minijinja::context! { enable_thinking => on, ..ctx },
            None => ctx,
        };
        tmpl.render(ctx).map_err(bad)
    }

    /// What this template writes around an assistant turn, learnt by rendering probe
    /// conversations (so that any template works, not a list of known ones):
    /// - the header: the text between a user turn and the assistant's content, read from a
    ///   turn that is not the last (Qwen3 adds a think block only to the last ones);
    /// - the end: what follows the content of a final assistant turn (`<|im_end|>\n`);
    /// - the forced prefix: what the generation prompt adds after the header, which the model
    ///   is given rather than writes (Qwen3's empty think block with thinking off).
    pub fn turn_marks(&self) -> Result<TurnMarks> {
        let (user, reply, next) = (
            "\u{E000}u\u{E000}",
            "\u{E001}a\u{E001}",
            "\u{E002}n\u{E002}",
        );
        let msg = |role: &str, content: &str| serde_json::json!({"role": role, "content": content});
        let first = self.render(&[msg("user", user)])?;
        let prompt = self.render_prompt(&[msg("user", user)])?;
        let middle = self.render(&[
            msg("user", user),
            msg("assistant", reply),
            msg("user", next),
        ])?;
        let last = self.render(&[msg("user", user), msg("assistant", reply)])?;
        let unmarked = || {
            anyhow::anyhow!(
                "chat template of {}: cannot tell where an assistant turn starts and ends (a \
                 probe conversation's assistant text did not come back as written); give \
                 pre-tokenized `input_ids` + `loss_mask` lines instead",
                self.origin
            )
        };
        let generation = prompt.strip_prefix(first.as_str()).unwrap_or("");
        let at = middle.find(reply).ok_or_else(unmarked)?;
        let header = match middle[..at].strip_prefix(first.as_str()) {
            Some(h) if !h.is_empty() => h.to_string(),
            _ => generation.to_string(),
        };
        let end = last.rfind(reply).ok_or_else(unmarked)? + reply.len();
        let end = last[end..].to_string();
        if header.is_empty() || end.is_empty() {
            return Err(unmarked());
        }
        let forced = generation
            .strip_prefix(header.as_str())
            .filter(|f| !f.is_empty())
            .map(str::to_string);
        Ok(TurnMarks {
            header,
            end,
            forced,
        })
    }
}

/// The text a template writes around an assistant turn (`ChatTemplate::turn_marks`).
#[derive(Clone, Debug, PartialEq)]
pub struct TurnMarks {
    pub header: String,
    pub end: String,
    pub forced: Option<String>,
}

/// Byte ranges of the assistant turns in the rendered text: from the end of each assistant
/// header through the first end-of-turn text after it (or the end of the text), as SpecForge
/// supervises them; the template's forced prefix (`TurnMarks::forced`) is cut out wherever it
/// stands inside a turn.
pub fn assistant_spans(text: &str, marks: &TurnMarks) -> Vec<Range<usize>> {
    let mut turns = Vec::new();
    let mut cursor = 0;
    while let Some(at) = text[cursor..].find(marks.header.as_str()) {
        let start = cursor + at + marks.header.len();
        let end = match text[start..].find(marks.end.as_str()) {
            Some(e) => start + e + marks.end.len(),
            None => text.len(),
        };
        turns.push(start..end);
        cursor = end;
    }
    let Some(forced) = marks.forced.as_deref() else {
        return turns;
    };
    let mut out = Vec::new();
    for turn in turns {
        let mut from = turn.start;
        while let Some(at) = text[from..turn.end].find(forced) {
            out.push(from..from + at);
            from += at + forced.len();
        }
        out.push(from..turn.end);
    }
    out.retain(|r| !r.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chatml(extra: &str) -> ChatTemplate {
        let source = format!(
            "{{% for m in messages %}}<|im_start|>{{{{ m.role }}}}\n{{{{ m.content }}}}<|im_end|>\n\
             {{% endfor %}}{{% if add_generation_prompt %}}<|im_start|>assistant\n{extra}{{% endif %}}"
        );
        ChatTemplate {
            source,
            origin: "test".into(),
            bos_token: String::new(),
            eos_token: String::new(),
            options: ChatOptions::default(),
        }
    }

    #[test]
    fn turns_run_from_the_header_through_the_end_of_turn() {
        let t = chatml("");
        let marks = t.turn_marks().unwrap();
        assert_eq!(marks.header, "<|im_start|>assistant\n");
        assert_eq!(marks.end, "<|im_end|>\n");
        assert_eq!(marks.forced, None);
        let msgs: Vec<serde_json::Value> = serde_json::from_str(
            r#"[{"role": "user", "content": "say ok"}, {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "ok?"}, {"role": "assistant", "content": "yes"}]"#,
        )
        .unwrap();
        let text = t.render(&msgs).unwrap();
        let got: Vec<&str> = assistant_spans(&text, &marks)
            .iter()
            .map(|r| &text[r.clone()])
            .collect();
        assert_eq!(got, vec!["ok<|im_end|>\n", "yes<|im_end|>\n"]);
    }

    #[test]
    fn a_forced_prefix_is_cut_out_and_a_system_prompt_put_first() {
        let t = chatml("<think></think>").with_options(ChatOptions {
            enable_thinking: Some(false),
            system_prompt: Some("be brief".into()),
        });
        let marks = t.turn_marks().unwrap();
        assert_eq!(marks.forced.as_deref(), Some("<think></think>"));
        let text = "<|im_start|>assistant\n<think></think>hi<|im_end|>\n";
        let got: Vec<&str> = assistant_spans(text, &marks)
            .iter()
            .map(|r| &text[r.clone()])
            .collect();
        assert_eq!(got, vec!["hi<|im_end|>\n"]);
        let msgs = [serde_json::json!({"role": "user", "content": "q"})];
        assert!(t
            .render(&msgs)
            .unwrap()
            .starts_with("<|im_start|>system\nbe brief"));
        // A conversation with its own system message keeps it alone.
        let own = [
            serde_json::json!({"role": "system", "content": "mine"}),
            serde_json::json!({"role": "user", "content": "q"}),
        ];
        let text = t.render(&own).unwrap();
        assert!(text.starts_with("<|im_start|>system\nmine") && !text.contains("be brief"));
    }
}
