//! The DFlash drafter: `fc` + `hidden_norm` over the concatenated target features (once), then
//! Qwen3 decoder layers whose attention takes queries from the block tokens and keys/values from
//! `[context, block]` (KV injection, the context never updated), then `norm`. Embeddings and the
//! lm head are the target's, frozen. Names match z-lab's `DFlashDraftModel` state dict.

use super::layers::{rope_tables, Linear, RmsNorm};
use super::qwen3::DecoderLayer;
use super::tiled::AttnMask;
use crate::engine::model::shapes::DrafterSpec;
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Drafter {
    pub spec: DrafterSpec,
    fc: Linear,
    hidden_norm: RmsNorm,
    layers: Vec<DecoderLayer>,
    norm: RmsNorm,
}

impl Drafter {
    pub fn new(root: &nn::Path, spec: &DrafterSpec) -> Drafter {
        let c = &spec.layers;
        let n_feat = spec.target_layer_ids.len() as i64;
        Drafter {
            spec: spec.clone(),
            fc: Linear::new(root / "fc", n_feat * c.hidden_size, c.hidden_size),
            hidden_norm: RmsNorm::new(root / "hidden_norm", c.hidden_size, c.rms_norm_eps),
            layers: (0..c.num_hidden_layers)
                .map(|i| DecoderLayer::new(root / "layers" / i, c))
                .collect(),
            norm: RmsNorm::new(root / "norm", c.hidden_size, c.rms_norm_eps),
        }
    }

    /// Final hidden states of the block tokens.
    // target_hidden [b, s, n*h], ctx_pos [b, s], block_emb [b, q, h], block_pos [b, q],
    // mask [b, 1, q, s + q] (true = attend) -> [b, q, h]
    pub fn forward(
        &self,
        target_hidden: &Tensor,
        ctx_pos: &Tensor,
        block_emb: &Tensor,
        block_pos: &Tensor,
        mask: &Tensor,
    ) -> Tensor {
        let mask = AttnMask::Dense(mask.shallow_clone());
        self.forward_masked(target_hidden, ctx_pos, block_emb, block_pos, &mask)
    }

    /// `forward` with the mask dense or in tiles (the tiled one skips what the mask hides).
    pub fn forward_masked(
        &self,
        target_hidden: &Tensor,
        ctx_pos: &Tensor,
        block_emb: &Tensor,
        block_pos: &Tensor,
        mask: &AttnMask,
    ) -> Tensor {
        let c = &self.spec.layers;
        let context = self.hidden_norm.forward(&self.fc.forward(target_hidden));
        let kind = block_emb.kind();
        let (qc, qs) = rope_tables(block_pos, c.head_dim, &c.rope(), kind);
        let all_pos = Tensor::cat(&[ctx_pos, block_pos], 1);
        let (kc, ks) = rope_tables(&all_pos, c.head_dim, &c.rope(), kind);
        let mut x = block_emb.shallow_clone();
        let Some(first) = self.layers.first() else {
            return self.norm.forward(&x);
        };
        let mut h = first.input_norm().forward(&x);
        for (i, layer) in self.layers.iter().enumerate() {
            let windowed;
            let layer_mask = if c.is_sliding(i) {
                let w = c.window_of(i);
                windowed = AttnMask::Dense(sliding(&mask.dense(), block_pos, &all_pos, w));
                &windowed
            } else {
                mask
            };
            let rope = ((&qc, &qs), (&kc, &ks));
            let (mid, mlp_out) =
                layer.attention_then_mlp(&x, &h, Some(&context), rope.0, rope.1, layer_mask);
            // The MLP's residual add in the norm after it (one pass each way where the kernel
            // runs): the next layer's input norm, after the last the drafter's own.
            let next = self
                .layers
                .get(i + 1)
                .map_or(&self.norm, |n| n.input_norm());
            (x, h) = next.add_forward(&mid, &mlp_out);
        }
        h
    }
}

/// A sliding-attention layer sees only keys at positions `q - window < k <= q` (no lower bound
/// without a window): causal, also inside the block, as dflash runs such a layer when it decodes
/// (its `_attention_mask` with `is_causal` for `sliding_attention` layers), on top of the block
/// mask.
// mask [b, 1, q, k], block_pos [b, q], all_pos [b, k] -> [b, 1, q, k]
pub fn sliding(mask: &Tensor, block_pos: &Tensor, all_pos: &Tensor, window: Option<i64>) -> Tensor {
    let dist = block_pos.unsqueeze(2) - all_pos.unsqueeze(1); // [b, q, k]
    let mut near = dist.ge(0);
    if let Some(w) = window {
        near = near.logical_and(&dist.lt(w));
    }
    mask.logical_and(&near.unsqueeze(1))
}
