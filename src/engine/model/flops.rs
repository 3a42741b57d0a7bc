//! FLOPs of a training step's parts as the step computes them, from the models' shapes: the
//! target's forward up to the deepest layer the drafter reads, the drafter's forward and
//! backward, the lm-head loss; for TFLOP/s figures, MFU (python/peer/compare.py's `step_flops`
//! counts the same) and the placement advice's estimate before anything has run.
//!
//! A multiply-add is 2 FLOPs; norms, RoPE, softmax and the optimizer are left out. Attention is
//! counted over the (query, key) pairs a query sees, which is what the kernels compute on CUDA:
//! the target's varlen flash attention (src/engine/model/varlen.rs) and the drafter's block attention
//! kernels (src/engine/model/tiled.rs). A row's `docs` are its documents' lengths in order, summing to
//! its length; `None` counts the row as one document, the most it can hold: an upper bound.

use crate::engine::model::shapes::{DrafterSpec, Qwen3Config};

/// Multiply-adds of one token through a decoder layer's weights (attention projections + MLP).
fn layer_macs(c: &Qwen3Config) -> f64 {
    let (h, hd) = (c.hidden_size as f64, c.head_dim as f64);
    let q = c.num_attention_heads as f64 * hd;
    let kv = c.num_key_value_heads as f64 * hd;
    h * (2.0 * q + 2.0 * kv) + 3.0 * h * c.intermediate_size as f64
}

/// The row's documents: `docs`, or the whole row as one.
fn documents(seq: i64, docs: Option<&[i64]>) -> Vec<f64> {
    match docs {
        Some(d) => {
            debug_assert_eq!(d.iter().sum::<i64>(), seq, "documents fill the row");
            d.iter().map(|&l| l as f64).collect()
        }
        None => vec![seq as f64],
    }
}

/// FLOPs of the target's forward over one row of `seq` tokens, up to the deepest layer the
/// drafter reads (the worker stops there): the matmuls, and attention causal within each
/// document (`docs`; without them the whole row's, an upper bound).
pub fn target_flops(
    target: &Qwen3Config,
    spec: &DrafterSpec,
    seq: i64,
    docs: Option<&[i64]>,
) -> f64 {
    let layers = super::qwen3::built_layers(target, &spec.target_layer_ids) as f64;
    // A document of L tokens: query i sees keys 0..=i, L (L + 1) / 2 pairs.
    let pairs: f64 = documents(seq, docs)
        .iter()
        .map(|l| l * (l + 1.0) / 2.0)
        .sum();
    let attention = 4.0 * pairs * (target.num_attention_heads * target.head_dim) as f64;
    layers * (2.0 * seq as f64 * layer_macs(target) + attention)
}

/// Context keys a block's queries see on average: its anchor's offset in its document (keys
/// `kv < anchor` of that document), for `anchors` spread uniformly over the positions an anchor
/// may take, every position but a document's last (src/engine/train/blocks.rs; the loss mask narrows
/// them further). An expected value: the count never sees the anchors drawn.
fn mean_context_keys(seq: i64, docs: Option<&[i64]>) -> f64 {
    let docs = documents(seq, docs);
    // Anchors at offsets 0..=L-2 of a document of L tokens: L - 1 of them, offsets summing to
    // (L - 1)(L - 2) / 2.
    let places: f64 = docs.iter().map(|l| (l - 1.0).max(0.0)).sum();
    let keys: f64 = docs
        .iter()
        .map(|l| (l - 1.0).max(0.0) * (l - 2.0).max(0.0) / 2.0)
        .sum();
    if places > 0.0 {
        keys / places
    } else {
        0.0
    }
}

/// The FLOPs of one drafter step over a row by phase, for `anchors` blocks a row (a row with
/// fewer anchors does less: an upper bound).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrafterFlops {
    /// The context projection `fc` over the row's `seq` tokens (once); per layer the block
    /// tokens' projections and MLP, the keys and values of the `seq` context tokens, and the
    /// attention over the keys each query sees: its anchor's context (`mean_context_keys`) and
    /// its own block.
    pub forward: f64,
    /// The frozen lm head's forward and its input gradient over the labelled slots only: slots
    /// 1.. of each block (slot 0, the anchor, has no label), anchors x (block - 1) rows; the
    /// loss (src/engine/train/loss.rs) sends only the rows that count through the head (`label_rows`
    /// in src/engine/train/blocks.rs), fewer where a block runs past its document: an upper bound.
    pub loss: f64,
    /// The input and weight gradients of the layers (twice their forward) and the weight
    /// gradient alone of `fc` (once its forward: its input, the target's features, is frozen).
    pub backward: f64,
}

impl DrafterFlops {
    pub fn step(&self) -> f64 {
        self.forward + self.loss + self.backward
    }
}

/// The drafter's step over one row of `seq` tokens with `anchors` blocks (see `DrafterFlops`).
pub fn drafter_flops(
    spec: &DrafterSpec,
    seq: i64,
    anchors: i64,
    docs: Option<&[i64]>,
) -> DrafterFlops {
    let d = &spec.layers;
    let (h, seq_f) = (d.hidden_size as f64, seq as f64);
    let block = spec.block_size as f64;
    let tokens = anchors as f64 * block;
    let q_dim = (d.num_attention_heads * d.head_dim) as f64;
    let kv_dim = (d.num_key_value_heads * d.head_dim) as f64;
    let keys = mean_context_keys(seq, docs) + block;
    let layer =
        2.0 * tokens * layer_macs(d) + 2.0 * seq_f * 2.0 * h * kv_dim + 4.0 * tokens * keys * q_dim;
    let layers = d.num_hidden_layers as f64 * layer;
    let fc = 2.0 * seq_f * spec.target_layer_ids.len() as f64 * h * h;
    let labelled = anchors as f64 * (block - 1.0).max(0.0);
    DrafterFlops {
        forward: layers + fc,
        loss: 2.0 * 2.0 * labelled * h * d.vocab_size as f64,
        backward: 2.0 * layers + fc,
    }
}

/// Drafter over target cost per batch, from FLOPs: the target's forward over `seq` tokens a row
/// against the drafter's step over `anchors` blocks a row, rows counted as one document each.
pub fn flop_ratio(target: &Qwen3Config, spec: &DrafterSpec, seq: i64, anchors: i64) -> f64 {
    drafter_flops(spec, seq, anchors, None).step() / target_flops(target, spec, seq, None).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::shapes::drafter_spec_for;
    use crate::engine::train::presets::Preset;

    /// Tiny shapes: hidden 8, intermediate 16, 2 heads and 1 KV head of 4, vocab 32; a target of
    /// 6 layers, a drafter of 2 reading target layers [1, 3], block 4.
    fn tiny() -> (Qwen3Config, DrafterSpec) {
        let mut t = Preset::by_name("tiny").unwrap().target;
        t.hidden_size = 8;
        t.intermediate_size = 16;
        t.num_hidden_layers = 6;
        t.num_attention_heads = 2;
        t.num_key_value_heads = 1;
        t.head_dim = 4;
        t.vocab_size = 32;
        let spec = drafter_spec_for(&t, 2, 31, 4);
        assert_eq!(spec.target_layer_ids, vec![1, 3]);
        (t, spec)
    }

    #[test]
    fn the_target_is_counted_by_hand_on_tiny_shapes_per_document() {
        let (t, spec) = tiny();
        // A token through a layer: 8 x (2 x 8 + 2 x 4) + 3 x 8 x 16 = 192 + 384 = 576
        // multiply-adds; 32 tokens: 2 x 32 x 576 = 36,864 FLOPs. Layers 0..=3 run: 4.
        // Documents of 20 and 12: 20 x 21 / 2 + 12 x 13 / 2 = 210 + 78 = 288 pairs,
        // 4 x 8 x 288 = 9,216 FLOPs; 4 x (36,864 + 9,216) = 184,320.
        assert_eq!(target_flops(&t, &spec, 32, Some(&[20, 12])), 184_320.0);
        // The whole row as one document: 32 x 33 / 2 = 528 pairs, 4 x 8 x 528 = 16,896;
        // 4 x (36,864 + 16,896) = 215,040.
        assert_eq!(target_flops(&t, &spec, 32, None), 215_040.0);
        assert_eq!(target_flops(&t, &spec, 32, Some(&[32])), 215_040.0);
    }

    #[test]
    fn the_drafter_is_counted_by_hand_on_tiny_shapes() {
        let (_, spec) = tiny();
        // One row of 32 tokens, 2 anchors of block 4: 8 block tokens.
        // Per layer: block tokens 2 x 8 x 576 = 9,216; the context's keys and values
        // 2 x 32 x 2 x 8 x 4 = 4,096; attention 4 x 8 (q dim) x 8 queries x keys.
        // Whole row: anchors at 0..=30, 15 context keys on average, + 4 block keys = 19:
        // 4 x 8 x 8 x 19 = 4,864. A layer 18,176, two 36,352.
        // fc: 2 x 32 x (2 x 8) x 8 = 8,192.
        let f = drafter_flops(&spec, 32, 2, None);
        assert_eq!(f.forward, 36_352.0 + 8_192.0);
        // Layers' input and weight gradients, fc's weight gradient only: 2 x 36,352 + 8,192.
        assert_eq!(f.backward, 80_896.0);
        // Labelled slots 2 x (4 - 1) = 6 rows through the 8 x 32 head, forward and input
        // gradient: 2 x 2 x 6 x 8 x 32 = 6,144.
        assert_eq!(f.loss, 6_144.0);
        assert_eq!(f.step(), 44_544.0 + 80_896.0 + 6_144.0);

        // Documents of 20 and 12: anchors at offsets 0..=18 and 0..=10, 30 places, context keys
        // (19 x 18 / 2 + 11 x 10 / 2) / 30 = 226 / 30 on average, + 4 = 346 / 30 keys;
        // attention 4 x 8 x 8 x 346 / 30. Layers 2 x (9,216 + 4,096 + 256 x 346 / 30).
        let f = drafter_flops(&spec, 32, 2, Some(&[20, 12]));
        let layers = 2.0 * (9_216.0 + 4_096.0 + 256.0 * 346.0 / 30.0);
        assert!((f.forward - (layers + 8_192.0)).abs() < 1e-9, "{f:?}");
        assert!(
            (f.backward - (2.0 * layers + 8_192.0)).abs() < 1e-9,
            "{f:?}"
        );
        assert_eq!(f.loss, 6_144.0);
        // The step with the target, as python/tests/test_peer_flops.py counts it:
        // 184,320 + 40,721.0667 + 73,250.1333 + 6,144 = 304,435.2.
        let (t, _) = tiny();
        let step = target_flops(&t, &spec, 32, Some(&[20, 12])) + f.step();
        assert!((step - 304_435.2).abs() < 1e-6, "{step}");
    }

    #[test]
    fn the_target_is_counted_up_to_the_deepest_layer_the_drafter_reads() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let spec = p.drafter_spec(&p.target);
        assert_eq!(spec.target_layer_ids.iter().max(), Some(&33));
        // By hand, one layer of Qwen3-8B over 3072 tokens: projections 4096 x (2 x 4096 +
        // 2 x 1024) and MLP 3 x 4096 x 12288 multiply-adds a token, plus causal attention
        // 4 x 3072 x 3073 / 2 x 4096: 1.1854 + 0.0773 = 1.2627 TFLOP; 34 layers.
        let t = target_flops(&p.target, &spec, 3072, None);
        assert!((t / 1e12 - 34.0 * 1.2627).abs() < 0.05, "{}", t / 1e12);
        let mut shallow = spec.clone();
        shallow.target_layer_ids = vec![0, 1];
        let two = target_flops(&p.target, &shallow, 3072, None);
        assert!((t / two - 17.0).abs() < 1e-9);
    }

    #[test]
    fn the_8b_drafters_flops_split_by_phase_as_counted_by_hand() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let f = drafter_flops(&p.drafter_spec(&p.target), 3072, 512, None);
        // A layer: 8192 block tokens x 2 x (4096 x (2 x 4096 + 2 x 1024) + 3 x 4096 x 12288)
        // = 3.1611; the context's keys and values 2 x 3072 x 2 x 4096 x 1024 = 0.0515;
        // attention 4 x 8192 x (1535 + 16) x 4096 = 0.2082: 3.4207 TFLOP, x 5 = 17.104.
        // fc 2 x 3072 x 5 x 4096 x 4096 = 0.5154. Forward 17.619; backward 2 x 17.104 + 0.5154
        // = 34.723; the head over 512 x 15 labelled slots, 4 x 7680 x 4096 x 151936 = 19.118.
        let tf = |x: f64| x / 1e12;
        assert!((tf(f.forward) - 17.619).abs() < 0.001, "{f:?}");
        assert!((tf(f.backward) - 34.723).abs() < 0.001, "{f:?}");
        assert!((tf(f.loss) - 19.118).abs() < 0.001, "{f:?}");
    }

    #[test]
    fn the_flop_estimate_puts_the_8b_drafter_near_the_target() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let r = flop_ratio(&p.target, &p.drafter_spec(&p.target), 3072, 512);
        // Counted by hand: target forward ≈ 43 TFLOP a row, drafter step ≈ 71 TFLOP.
        assert!((1.0..2.5).contains(&r), "{r}");
    }
}
