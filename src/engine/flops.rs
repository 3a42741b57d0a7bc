//! FLOPs of a training step's parts, from the models' shapes: the target's forward up to the
//! deepest layer the drafter reads, the drafter's forward and backward; for TFLOP/s figures and
//! the placement advice's estimate before anything has run.

use super::config::{DrafterSpec, Qwen3Config};

/// Multiply-adds of one token through a decoder layer's weights (attention projections + MLP).
fn layer_macs(c: &Qwen3Config) -> f64 {
    let (h, hd) = (c.hidden_size as f64, c.head_dim as f64);
    let q = c.num_attention_heads as f64 * hd;
    let kv = c.num_key_value_heads as f64 * hd;
    h * (2.0 * q + 2.0 * kv) + 3.0 * h * c.intermediate_size as f64
}

/// FLOPs of the target's forward over one row of `seq` tokens, up to the deepest layer the
/// drafter reads (the worker stops there): the matmuls, and attention counted as causal over the
/// whole row (a packed row's documents see fewer keys: an upper bound, "TFLOP/s-equivalent").
pub fn target_flops(target: &Qwen3Config, spec: &DrafterSpec, seq: i64) -> f64 {
    let seq = seq as f64;
    let layers = super::qwen3::built_layers(target, &spec.target_layer_ids) as f64;
    let attention = 4.0 * seq * seq / 2.0 * (target.num_attention_heads * target.head_dim) as f64;
    layers * (2.0 * seq * layer_macs(target) + attention)
}

/// Drafter over target cost per batch, from FLOPs: the target's forward over `seq` tokens a row
/// against the drafter's forward and backward over `anchors` blocks a row (its layers, the
/// frozen lm head's forward and input gradient, the context projection).
pub fn flop_ratio(target: &Qwen3Config, spec: &DrafterSpec, seq: i64, anchors: i64) -> f64 {
    let target_flops = target_flops(target, spec, seq);
    let seq = seq as f64;
    let d = &spec.layers;
    let tokens = (anchors * spec.block_size) as f64;
    let layers = d.num_hidden_layers as f64;
    let context = spec.target_layer_ids.len() as f64 * (d.hidden_size * d.hidden_size) as f64;
    let forward = 2.0 * tokens * layer_macs(d) * layers + 2.0 * seq * context;
    let head = 2.0 * tokens * (d.hidden_size * d.vocab_size) as f64;
    let drafter_flops = 3.0 * forward + 2.0 * head;
    drafter_flops / target_flops.max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::Preset;

    #[test]
    fn the_target_is_counted_up_to_the_deepest_layer_the_drafter_reads() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let spec = p.drafter_spec(&p.target);
        assert_eq!(spec.target_layer_ids.iter().max(), Some(&33));
        // By hand, one layer of Qwen3-8B over 3072 tokens: projections 4096 x (2 x 4096 +
        // 2 x 1024) and MLP 3 x 4096 x 12288 multiply-adds a token, plus causal attention
        // 4 x 3072^2 / 2 x 4096: 1.1854 + 0.0773 = 1.2627 TFLOP; 34 layers.
        let t = target_flops(&p.target, &spec, 3072);
        assert!((t / 1e12 - 34.0 * 1.2627).abs() < 0.05, "{}", t / 1e12);
        let mut shallow = spec.clone();
        shallow.target_layer_ids = vec![0, 1];
        let two = target_flops(&p.target, &shallow, 3072);
        assert!((t / two - 17.0).abs() < 1e-9);
    }

    #[test]
    fn the_flop_estimate_puts_the_8b_drafter_near_the_target() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let r = flop_ratio(&p.target, &p.drafter_spec(&p.target), 3072, 512);
        // Counted by hand: target forward ≈ 43 TFLOP a row, drafter step ≈ 70 TFLOP.
        assert!((1.0..2.5).contains(&r), "{r}");
    }
}
