//! What a run's workers hold on a GPU, estimated from the shapes, for the placement advice (is
//! there room for a target and a drafter on one card?):
//! - the target: its layers up to the deepest one the drafter reads (the others are never built,
//!   src/engine/pipeline/parts.rs) in bf16 or, with `--target-precision fp8`, a byte a weight;
//!   its embedding and head in bf16. A bf16 target's load peaks at its layers; an FP8 target
//!   is loaded and quantized a layer at a time, before the drafter is built: its FP8 layers, one
//!   layer in bf16 and the copies quantizing its largest weight takes (13 bytes a weight);
//! - the drafter: its layers and `fc` at 16 bytes a parameter on a GPU (bf16 weight and gradient,
//!   f32 master, m and v: src/engine/train/optim.rs), 12 with `--optimizer-states bf16`; it reads
//!   the target's embedding and head (a copy of them on a device of its own);
//! - activations, fitted to the peaks measured on an H100 (docs/performance.md): 64 bytes a row
//!   token a unit of width for the target's side (its captured states, its forward's working
//!   set; the slope from 3K to 32K tokens at 8B); for the drafter's, a drafter token (anchors x
//!   block) takes 50.7 bytes a unit of hidden width and 58.1 a unit of MLP width (fitted to 8B,
//!   whose MLP is 3x its width, and 32B, 5x: 225 bytes a unit of hidden width at 3x), and 1 GiB
//!   for the loss's chunk of logits: within 5% of the six peaks measured (0.6B, 8B at 3K and
//!   32K, 8B with bf16 moments, 14B, 32B with an FP8 target and bf16 moments;
//!   src/config/tests/placement.rs holds them).

use super::fp8::TargetPrecision;
use super::shapes::{DrafterSpec, Qwen3Config};

/// Bytes a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;
/// Activation bytes a row token a unit of hidden width (target side).
const TARGET_ACT: f64 = 64.0;
/// Activation bytes a drafter token a unit of hidden width and a unit of MLP width (drafter side).
const DRAFTER_ACT_HIDDEN: f64 = 50.7;
const DRAFTER_ACT_MLP: f64 = 58.1;
/// Bytes a weight takes while it is quantized (src/engine/model/fp8.rs): its f32 copy, the copy
/// divided by the scales, that clamped (4 bytes each) and the e4m3 result, at once.
const QUANTIZE_COPIES: f64 = 13.0;
/// Bytes a drafter parameter takes on a GPU besides its moments: the bf16 weight and gradient
/// and the f32 master.
const DRAFTER_PARAM: f64 = 8.0;
/// The loss's chunk of logits over the vocabulary and its gradient (512 MiB each at the default
/// `loss_chunk_mib`).
const LOSS_CHUNK_GIB: f64 = 1.0;

/// GiB each side needs on a GPU; `shared` is the frozen embedding and head both read (held once
/// where they share a card, on each card where they do not).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryNeed {
    pub target_gib: f64,
    /// The target's peak while its weights load, before the drafter is built (an FP8 target's
    /// layers are loaded and quantized one at a time: one of them in bf16 beside the others).
    pub target_load_gib: f64,
    pub drafter_gib: f64,
    pub shared_gib: f64,
}

impl MemoryNeed {
    /// A target and a drafter on one card (or the target's load, where that is more).
    pub fn together_gib(&self) -> f64 {
        (self.target_gib + self.drafter_gib).max(self.target_load_gib) + self.shared_gib
    }

    /// The larger of the two, each on a card of its own.
    pub fn apart_gib(&self) -> f64 {
        self.target_gib
            .max(self.target_load_gib)
            .max(self.drafter_gib)
            + self.shared_gib
    }
}

/// Parameters of one decoder layer (projections; norms left out).
fn layer_params(c: &Qwen3Config) -> f64 {
    let (h, d) = (c.hidden_size as f64, c.head_dim as f64);
    let q = c.num_attention_heads as f64 * d;
    let kv = c.num_key_value_heads as f64 * d;
    h * (2.0 * q + 2.0 * kv) + 3.0 * h * c.intermediate_size as f64
}

/// The target's layers that are built, as the target counts them (up to the deepest one the
/// drafter reads).
fn built_layers(target: &Qwen3Config, spec: &DrafterSpec) -> i64 {
    super::qwen3::built_layers(target, &spec.target_layer_ids)
}

/// The target's embedding and head (one where they are tied), in weights.
fn embedding_and_head(target: &Qwen3Config) -> f64 {
    let heads = if target.tie_word_embeddings { 1.0 } else { 2.0 };
    heads * target.vocab_size as f64 * target.hidden_size as f64
}

/// The drafter's trained parameters: its layers and `fc` over the captured layers.
fn drafter_params(target: &Qwen3Config, spec: &DrafterSpec) -> f64 {
    let h = target.hidden_size as f64;
    let fc = spec.target_layer_ids.len() as f64 * h * h;
    spec.layers.num_hidden_layers as f64 * layer_params(&spec.layers) + fc
}

/// The estimate for `batch` rows of `seq_len` tokens and `anchors` a row, the drafter's AdamW
/// moments taking `moment_bytes` a parameter (8 in f32, 4 in bf16).
pub fn need(
    target: &Qwen3Config,
    precision: TargetPrecision,
    moment_bytes: f64,
    spec: &DrafterSpec,
    seq_len: i64,
    anchors: i64,
    batch: i64,
) -> MemoryNeed {
    let h = target.hidden_size as f64;
    let shared = embedding_and_head(target) * 2.0;
    let layers = built_layers(target, spec) as f64 * layer_params(target);
    let target_weights = layers * precision.weight_bytes();
    let one_layer_bf16 = layer_params(target) * TargetPrecision::Bf16.weight_bytes();
    let q_kv = (target.num_attention_heads + 2 * target.num_key_value_heads) * target.head_dim;
    let largest = h * target.intermediate_size.max(q_kv) as f64;
    let load = match precision {
        TargetPrecision::Bf16 => target_weights,
        TargetPrecision::Fp8 => target_weights + one_layer_bf16 + QUANTIZE_COPIES * largest,
    };
    let drafter_params = drafter_params(target, spec);
    let rows = batch.max(1) as f64;
    let target_act = TARGET_ACT * h * (seq_len as f64) * rows;
    let per_token = DRAFTER_ACT_HIDDEN * h + DRAFTER_ACT_MLP * spec.layers.intermediate_size as f64;
    let drafter_act = per_token * (anchors * spec.block_size) as f64 * rows;
    MemoryNeed {
        target_gib: (target_weights + target_act) / GIB,
        target_load_gib: load / GIB,
        drafter_gib: (drafter_params * (DRAFTER_PARAM + moment_bytes) + drafter_act) / GIB
            + LOSS_CHUNK_GIB,
        shared_gib: shared / GIB,
    }
}

/// GiB the weights alone take in host memory where a side trains on the CPU, in f32 there: the
/// target's built layers (a byte a weight in FP8), its embedding and head (held once), and the
/// drafter's weight, gradient and AdamW moments (`moment_bytes` a parameter). A floor, not an
/// estimate: activations come on top.
pub fn host_weights_gib(
    target: &Qwen3Config,
    precision: TargetPrecision,
    moment_bytes: f64,
    spec: &DrafterSpec,
    target_on_cpu: bool,
    drafter_on_cpu: bool,
) -> f64 {
    let shared = embedding_and_head(target) * 4.0;
    let layer_bytes = match precision {
        TargetPrecision::Bf16 => 4.0,
        TargetPrecision::Fp8 => 1.0,
    };
    let target_bytes = built_layers(target, spec) as f64 * layer_params(target) * layer_bytes;
    let drafter_bytes = drafter_params(target, spec) * (8.0 + moment_bytes);
    let mut bytes = 0.0;
    if target_on_cpu {
        bytes += target_bytes;
    }
    if drafter_on_cpu {
        bytes += drafter_bytes;
    }
    if target_on_cpu || drafter_on_cpu {
        bytes += shared;
    }
    bytes / GIB
}
