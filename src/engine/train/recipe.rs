//! The training recipe (drafter depth, block, sequence length, anchors, learning rate) and the
//! mask token: SpecForge's defaults for a `--target` directory, a preset's own for runs with
//! random weights. Flags and the TOML file override either (src/config.rs applies them).

use super::blocks::AnchorScope;
use crate::engine::model::shapes::{DrafterSpec, Qwen3Config};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// What a run trains with, besides the model shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    /// Decoder layers of a fresh drafter (the released Qwen3 drafters have 5).
    pub drafter_layers: i64,
    pub block_size: i64,
    pub seq_len: i64,
    /// Packed rows per batch.
    pub batch: i64,
    /// Anchors per document or per packed row (`anchor_scope`); SpecForge: up to
    /// `num_anchors` per sequence, one conversation a sequence.
    pub anchors: i64,
    pub anchor_scope: AnchorScope,
    /// Optimizer steps each packed batch trains, each on its share of the batch's anchors (the
    /// target's hidden states computed once).
    pub steps_per_batch: i64,
    /// Peak learning rate.
    pub lr: f64,
}

impl Recipe {
    /// SpecForge's DFlash defaults (examples/configs/qwen3-8b-dflash-online.yaml and the
    /// released drafters): 5 layers, block 16, max_length 3072, 512 anchors, lr 6e-4. The batch is
    /// one row of 3072 tokens per drafter (SpecForge's example takes 4 per GPU; one keeps an 8B
    /// target and its drafter within one GPU's memory).
    pub const fn specforge() -> Recipe {
        Recipe {
            drafter_layers: 5,
            block_size: 16,
            seq_len: 3072,
            batch: 1,
            anchors: 512,
            anchor_scope: AnchorScope::PerRow,
            steps_per_batch: 1,
            lr: 6e-4,
        }
    }

    /// A `--target` run's recipe: SpecForge's, trained as SpecForge trains at its batch of one
    /// conversation, a step a document on that document's anchors (`--steps-per-batch doc`,
    /// `--anchor-budget per-doc`), the target's hidden states still computed a packed row at a
    /// time. On a real target (SmolLM2-135M-Instruct, 262K target tokens, 3 seeds x 128 held-out
    /// prompts, one H100, docs/quality.md) it reached 1.136 against SpecForge's 1.121 at batch 1,
    /// paired +0.015 [+0.009, +0.020], where 6 steps a row of 3,072 reached 1.095 (-0.022); the
    /// presets, which time the engine, keep one step a row.
    pub const fn for_target() -> Recipe {
        Recipe {
            anchor_scope: AnchorScope::PerDoc,
            steps_per_batch: STEP_PER_DOC,
            ..Recipe::specforge()
        }
    }

    /// A `--target` run with several drafter replicas, which step together while each one's
    /// batch holds its own count of documents: 6 optimizer steps a row of 3,072 on a budget per
    /// row (a step per 512 target tokens; +0.043 [+0.034, +0.053] over one step a row on the
    /// same real target).
    pub const fn for_target_replicas() -> Recipe {
        Recipe {
            steps_per_batch: 6,
            ..Recipe::specforge()
        }
    }
}

/// `--steps-per-batch doc`: an optimizer step for each document of a batch, on that document's
/// anchors (SpecForge's batch of one conversation a step), the target's hidden states still
/// computed a packed batch at a time. Kept as `steps_per_batch` (and in checkpoints) as this
/// value.
pub const STEP_PER_DOC: i64 = -1;

/// `--steps-per-batch`'s value from its text: a count of 1 or more, or `doc`.
pub fn parse_steps_per_batch(text: &str) -> Result<i64, String> {
    match text {
        "doc" => Ok(STEP_PER_DOC),
        n => match n.parse::<i64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "`{text}`: give 1 or more optimizer steps a batch, or `doc` (a step a document)"
            )),
        },
    }
}

/// `--steps-per-batch`'s value as a user writes it.
pub fn steps_per_batch_name(steps: i64) -> String {
    match steps {
        STEP_PER_DOC => "doc".into(),
        n => n.to_string(),
    }
}

/// A mask token id and where it came from (shown in the `config:` line).
#[derive(Clone, Debug, PartialEq)]
pub struct MaskToken {
    pub id: i64,
    pub source: String,
    /// The token's text when the tokenizer has it (an added `<|MASK|>`).
    pub content: Option<String>,
}

/// `<|MASK|>`, `<mask>`, `[MASK]`: an added token whose bare name is "mask".
fn is_mask_like(content: &str) -> bool {
    let bare = content.trim_matches(|c: char| "<>|[]_ ".contains(c));
    bare.eq_ignore_ascii_case("mask")
}

fn read_json(path: &Path) -> Result<Option<serde_json::Value>> {
    if !path.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(v))
}

/// (id, content) of the added tokens of tokenizer_config.json (`added_tokens_decoder`) and
/// tokenizer.json (`added_tokens`).
fn added_tokens(
    config: Option<&serde_json::Value>,
    tok: Option<&serde_json::Value>,
) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    if let Some(map) = config
        .and_then(|c| c.get("added_tokens_decoder"))
        .and_then(|m| m.as_object())
    {
        for (id, t) in map {
            if let (Ok(id), Some(c)) = (id.parse(), t.get("content").and_then(|c| c.as_str())) {
                out.push((id, c.to_string()));
            }
        }
    }
    if let Some(list) = tok
        .and_then(|t| t.get("added_tokens"))
        .and_then(|l| l.as_array())
    {
        for t in list {
            if let (Some(id), Some(c)) = (
                t.get("id").and_then(|i| i.as_i64()),
                t.get("content").and_then(|c| c.as_str()),
            ) {
                out.push((id, c.to_string()));
            }
        }
    }
    out
}

/// The number of ids the tokenizer uses: its largest id + 1 (model vocabulary and added tokens).
fn tokenizer_size(tok: &serde_json::Value, added: &[(i64, String)]) -> Option<i64> {
    let model_max = match tok.get("model").and_then(|m| m.get("vocab")) {
        Some(serde_json::Value::Object(m)) => m.values().filter_map(|v| v.as_i64()).max(),
        // Unigram: a list of [piece, score], ids are the indices.
        Some(serde_json::Value::Array(a)) => Some(a.len() as i64 - 1),
        _ => None,
    }?;
    let added_max = added.iter().map(|(id, _)| *id).max().unwrap_or(-1);
    Some(model_max.max(added_max) + 1)
}

/// The id of the tokenizer's `{role}_token` (`pad`, `eos`, `unk`) in tokenizer_config.json: its
/// text (a string or `{"content": ..}`) looked up among the added tokens and the vocabulary,
/// else `{role}_token_id`.
fn special_token_id(
    role: &str,
    config: Option<&serde_json::Value>,
    tok: Option<&serde_json::Value>,
    added: &[(i64, String)],
) -> Option<(i64, Option<String>)> {
    let config = config?;
    let text = config.get(format!("{role}_token")).and_then(|t| {
        t.as_str()
            .or_else(|| t.get("content").and_then(|c| c.as_str()))
    });
    if let Some(text) = text {
        let id = added
            .iter()
            .find(|(_, c)| c == text)
            .map(|(id, _)| *id)
            .or_else(|| tok?.get("model")?.get("vocab")?.get(text)?.as_i64());
        if let Some(id) = id {
            return Some((id, Some(text.to_string())));
        }
    }
    let id = config.get(format!("{role}_token_id"))?.as_i64()?;
    Some((id, None))
}

/// The mask token of a target directory, the way SpecForge resolves it when no id is given
/// (its `resolve_mask_token_id`): an added token named like `<|MASK|>`, else the first id the
/// tokenizer does not use when the embedding table has room for it (Qwen3's tokenizer uses
/// 151,669 ids of 151,936, so 151669, the id of the released Qwen3 drafters), else the
/// tokenizer's pad, end or unknown token (a vocabulary with no room, as SmolLM2's 49,152 ids
/// are all used: its pad token `<|im_end|>`). None when the directory offers none of them.
pub fn mask_token_of(dir: &Path, vocab_size: i64) -> Result<Option<MaskToken>> {
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    let tok = read_json(&dir.join("tokenizer.json"))?;
    let added = added_tokens(config.as_ref(), tok.as_ref());
    if let Some((id, content)) = added
        .iter()
        .find(|(id, c)| is_mask_like(c) && (0..vocab_size).contains(id))
    {
        return Ok(Some(MaskToken {
            id: *id,
            source: format!("added-token:{content}"),
            content: Some(content.clone()),
        }));
    }
    if let Some(size) = tok.as_ref().and_then(|t| tokenizer_size(t, &added)) {
        if size < vocab_size {
            return Ok(Some(MaskToken {
                id: size,
                source: "first-unused-id".into(),
                content: None,
            }));
        }
    }
    for role in ["pad", "eos", "unk"] {
        let found = special_token_id(role, config.as_ref(), tok.as_ref(), &added);
        if let Some((id, text)) = found.filter(|(id, _)| (0..vocab_size).contains(id)) {
            return Ok(Some(MaskToken {
                id,
                source: format!("{role}-token:{}", text.as_deref().unwrap_or("by-id")),
                content: text,
            }));
        }
    }
    Ok(None)
}

/// Refuses a drafter that does not fit the target: another width, target layers it does not
/// have, a mask token outside its vocabulary.
pub fn check_pair(spec: &DrafterSpec, target: &Qwen3Config) -> Result<()> {
    if spec.layers.hidden_size != target.hidden_size {
        bail!(
            "the drafter's hidden_size ({}) differs from the target's ({}): pair a drafter with \
             the target it was trained for",
            spec.layers.hidden_size,
            target.hidden_size
        );
    }
    if let Some(bad) = spec
        .target_layer_ids
        .iter()
        .find(|&&i| i < 0 || i >= target.num_hidden_layers)
    {
        bail!(
            "the drafter reads target layer {bad}, but the target has {} layers",
            target.num_hidden_layers
        );
    }
    if spec.mask_token_id < 0 || spec.mask_token_id >= target.vocab_size {
        bail!(
            "mask_token_id {} is outside the target's vocabulary ({}): give --mask-token-id \
             below it",
            spec.mask_token_id,
            target.vocab_size
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_like_names() {
        for yes in ["<|MASK|>", "<mask>", "[MASK]", "<|mask|>"] {
            assert!(is_mask_like(yes), "{yes}");
        }
        for no in ["<|im_end|>", "masking", "<|endoftext|>"] {
            assert!(!is_mask_like(no), "{no}");
        }
    }

    #[test]
    fn an_added_mask_token_wins_then_the_first_unused_id() {
        let dir = tempfile::tempdir().unwrap();
        let tok = serde_json::json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}},
            "added_tokens": [{"id": 3, "content": "<|im_end|>"}],
        });
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        let m = mask_token_of(dir.path(), 10).unwrap().unwrap();
        assert_eq!((m.id, m.source.as_str()), (4, "first-unused-id"));
        // A tokenizer that fills the table leaves nothing.
        assert_eq!(mask_token_of(dir.path(), 4).unwrap(), None);
        let cfg = serde_json::json!({"added_tokens_decoder": {
            "3": {"content": "<|im_end|>"}, "7": {"content": "<|MASK|>"}}});
        std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let m = mask_token_of(dir.path(), 10).unwrap().unwrap();
        assert_eq!(m.id, 7);
        assert!(m.source.contains("<|MASK|>"));
        assert_eq!(
            mask_token_of(tempfile::tempdir().unwrap().path(), 10).unwrap(),
            None
        );
    }

    /// A tokenizer that fills the table (SmolLM2's) leaves SpecForge's later candidates: the pad
    /// token, else the end token, else the unknown one, by text or by id.
    #[test]
    fn a_full_vocabulary_falls_back_to_the_pad_then_end_then_unknown_token() {
        let dir = tempfile::tempdir().unwrap();
        let tok = serde_json::json!({
            "model": {"type": "BPE", "vocab": {"<|endoftext|>": 0, "a": 1, "b": 2, "c": 3}},
            "added_tokens": [
                {"id": 0, "content": "<|endoftext|>"},
                {"id": 3, "content": "<|im_end|>"},
            ],
        });
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
        let write = |cfg: serde_json::Value| {
            std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap()
        };
        write(serde_json::json!({
            "pad_token": "<|im_end|>", "eos_token": "b", "unk_token": "<|endoftext|>"
        }));
        let m = mask_token_of(dir.path(), 4).unwrap().unwrap();
        assert_eq!((m.id, m.source.as_str()), (3, "pad-token:<|im_end|>"));
        assert_eq!(m.content.as_deref(), Some("<|im_end|>"));
        write(serde_json::json!({"eos_token": {"content": "b"}, "unk_token": "<|endoftext|>"}));
        assert_eq!(mask_token_of(dir.path(), 4).unwrap().unwrap().id, 2);
        write(serde_json::json!({"unk_token_id": 0}));
        let m = mask_token_of(dir.path(), 4).unwrap().unwrap();
        assert_eq!((m.id, m.source.as_str()), (0, "unk-token:by-id"));
        assert_eq!(m.content, None);
    }
}
