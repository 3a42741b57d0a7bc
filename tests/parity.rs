//! Supervision as SpecForge's: our anchor sampler and chat loss masks against SpecForge 0.2.0's
//! own code on the same inputs (tests/reference/specforge_parity.py runs it; `make test` too);
//! parity/step.rs: one whole training step (tests/reference/specforge_step.py).

use dflash_top::engine::data::chat::ChatOptions;
use dflash_top::engine::data::tokenize::{line_doc, TextTokenizer};
use dflash_top::engine::data::Rng;
use dflash_top::engine::train::blocks::{sample_anchors, AnchorScope};
use std::path::PathBuf;

fn parity_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference/parity");
    assert!(
        dir.join("parity.json").is_file(),
        "{} is missing: `make test` (or `make reference`) writes it with SpecForge 0.2.0",
        dir.display()
    );
    dir
}

fn parity() -> serde_json::Value {
    let text = std::fs::read_to_string(parity_dir().join("parity.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn vec_of<T: serde::de::DeserializeOwned>(v: &serde_json::Value) -> Vec<T> {
    serde_json::from_value(v.clone()).unwrap()
}

/// The rule, not the draw: with a budget above every document's length both samplers take all
/// candidates, so the sets must be equal, document by document; with a budget of 3 per
/// document, each document gets as many as SpecForge draws for it, all among its candidates.
#[test]
fn anchor_candidates_are_specforges_per_document() {
    let p = parity();
    let rows = p["anchors"].as_array().unwrap();
    assert!(rows.len() >= 20);
    let mut rng = Rng::new(9);
    let mut with_tail = 0;
    for (r, row) in rows.iter().enumerate() {
        let docs: Vec<i64> = vec_of(&row["doc_ids"]);
        let mask: Vec<bool> = vec_of(&row["loss_mask"]);
        let theirs: Vec<Vec<i64>> = vec_of(&row["candidates"]);
        let all: Vec<i64> = theirs.iter().flatten().copied().collect();
        let ours = sample_anchors(&docs, &mask, docs.len() + 1, AnchorScope::PerDoc, &mut rng);
        assert_eq!(ours, all, "row {r}: candidates differ");
        // Per row with the same large budget: the same set.
        let ours = sample_anchors(&docs, &mask, docs.len() + 1, AnchorScope::PerRow, &mut rng);
        assert_eq!(ours, all, "row {r}: per-row candidates differ");
        // Anchors within a block of their document's end: the end token is a label at slots
        // that a block-inside-the-document rule never supervises.
        with_tail += theirs
            .iter()
            .flatten()
            .filter(|&&a| {
                let d = docs[a as usize];
                let end = docs.iter().rposition(|&x| x == d).unwrap() as i64 + 1;
                end - a < 16
            })
            .count();
        let drawn: Vec<usize> = vec_of(&row["drawn_with_budget_3"]);
        let ours = sample_anchors(&docs, &mask, 3, AnchorScope::PerDoc, &mut rng);
        for (d, cands) in theirs.iter().enumerate() {
            let Some(&first) = cands.first() else {
                continue;
            };
            let doc = docs[first as usize];
            let got: Vec<i64> = ours
                .iter()
                .copied()
                .filter(|&a| docs[a as usize] == doc)
                .collect();
            assert_eq!(got.len(), drawn[d], "row {r} document {d}: anchors drawn");
            assert!(
                got.iter().all(|a| cands.contains(a)),
                "row {r} document {d}"
            );
        }
        // Per row, the budget is the row's.
        let ours = sample_anchors(&docs, &mask, 3, AnchorScope::PerRow, &mut rng);
        assert_eq!(ours.len(), all.len().min(3), "row {r}: per-row budget");
    }
    assert!(
        with_tail > 0,
        "the references hold anchors near a document's end"
    );
}

/// Conversations rendered through a Qwen3-style template and masked by SpecForge's parsers
/// (`qwen3-thinking`: reasoning supervised; `qwen3-instruct`: thinking off, the empty think
/// block not supervised; both with SpecForge's default system prompt): the same token ids and
/// the same loss mask here, through the same tokenizer.
#[test]
fn chat_loss_masks_are_specforges_on_a_qwen3_style_template() {
    let p = parity();
    let tokenizer = parity_dir().join("chat/tokenizer.json");
    let chats = p["chat"].as_array().unwrap();
    assert!(chats.len() >= 8);
    for (i, c) in chats.iter().enumerate() {
        let options = ChatOptions {
            enable_thinking: c["enable_thinking"].as_bool(),
            system_prompt: c["system_prompt"].as_str().map(str::to_string),
        };
        let tok = TextTokenizer::open_with(&tokenizer, options).unwrap();
        let line = serde_json::json!({ "messages": c["messages"] });
        let doc = line_doc(&line, 1 << 20, || Ok(&tok)).unwrap();
        let ids: Vec<i64> = vec_of(&c["input_ids"]);
        let mask: Vec<bool> = vec_of(&c["loss_mask"]);
        assert_eq!(doc.ids, ids, "conversation {i} ({}): ids", c["template"]);
        assert_eq!(
            doc.loss_mask, mask,
            "conversation {i} ({}): loss mask",
            c["template"]
        );
        assert!(
            mask.iter().any(|&m| m),
            "conversation {i} supervises something"
        );
    }
}

mod step;
