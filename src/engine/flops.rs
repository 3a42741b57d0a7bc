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

/// The matmul FLOPs of one drafter step over a row by phase (attention left out: its windows
/// are small), for `anchors` blocks a row (a row with fewer anchors does less: an upper bound).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DrafterFlops {
    /// Its layers over the blocks and the context projection over the row's `seq` tokens.
    pub forward: f64,
    /// The frozen lm head's forward and its input gradient (the loss phase computes both).
    pub loss: f64,
    /// The input and weight gradients of the forward's matmuls: twice the forward.
    pub backward: f64,
}

impl DrafterFlops {
    pub fn step(&self) -> f64 {
        self.forward + self.loss + self.backward
    }
}

pub fn drafter_flops(spec: &DrafterSpec, seq: i64, anchors: i64) -> DrafterFlops {
    let d = &spec.layers;
    let tokens = (anchors * spec.block_size) as f64;
    let layers = d.num_hidden_layers as f64;
    let context = spec.target_layer_ids.len() as f64 * (d.hidden_size * d.hidden_size) as f64;
    let forward = 2.0 * tokens * layer_macs(d) * layers + 2.0 * seq as f64 * context;
    let head = 2.0 * tokens * (d.hidden_size * d.vocab_size) as f64;
    DrafterFlops {
        forward,
        loss: 2.0 * head,
        backward: 2.0 * forward,
    }
}

/// Drafter over target cost per batch, from FLOPs: the target's forward over `seq` tokens a row
/// against the drafter's forward and backward over `anchors` blocks a row (its layers, the
/// frozen lm head's forward and input gradient, the context projection).
pub fn flop_ratio(target: &Qwen3Config, spec: &DrafterSpec, seq: i64, anchors: i64) -> f64 {
    drafter_flops(spec, seq, anchors).step() / target_flops(target, spec, seq).max(1.0)
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

    #[test]
    fn the_drafters_flops_split_by_phase_as_counted_by_hand() {
        let p = Preset::by_name("qwen3-8b").unwrap();
        let spec = p.drafter_spec(&p.target);
        let f = drafter_flops(&spec, 3072, 512);
        // 8192 block tokens through 5 layers of 4096 x (2 x 4096 + 2 x 1024) + 3 x 4096 x 12288
        // multiply-adds, plus 3072 tokens through a 5 x 4096 -> 4096 projection: 16.32 TFLOP;
        // the head 8192 x 4096 x 151936 twice (forward, input gradient): 20.39 TFLOP.
        assert!(
            (f.forward / 1e12 - 16.32).abs() < 0.05,
            "{}",
            f.forward / 1e12
        );
        assert!((f.loss / 1e12 - 20.39).abs() < 0.05, "{}", f.loss / 1e12);
        assert_eq!(f.backward, 2.0 * f.forward);
        assert_eq!(f.step(), f.forward + f.loss + f.backward);
    }
}
