//! The building blocks both models share: linear (with a bias where the config has one), RMSNorm
//! in fp32, rotary tables (plain or llama3-scaled), the SwiGLU MLP. Weights live in the dtype their VarStore gives them; `compute` is the dtype the
//! matmuls run in (bf16 on GPU, f32 on CPU), so fp32 master weights train with bf16 compute.

use crate::engine::model::fp8::Fp8Weight;
use crate::engine::model::shapes::{Qwen3Config, Rope};
use tch::{nn, Kind, Tensor};

/// Std of a fresh linear weight: `initializer_range` of the Qwen3 config that z-lab's
/// `DFlashDraftModel` (a `Qwen3PreTrainedModel`) inits with in `_init_weights`.
pub const INITIALIZER_RANGE: f64 = 0.02;

/// `y = x W^T (+ b)`; `W` is [out, in], fresh ones drawn from normal(0, 0.02) as
/// transformers' `_init_weights` does (biases start at 0, RMSNorm weights at 1).
#[derive(Debug)]
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// The weight in e4m3 (a frozen target's with `--target-precision fp8`: src/engine/model/
    /// fp8.rs), which the forward then multiplies by; `weight` is emptied.
    fp8: Option<Fp8Weight>,
}

impl Linear {
    /// Without a bias.
    pub fn new(p: nn::Path, inp: i64, out: i64) -> Linear {
        Self::with_bias(p, inp, out, false)
    }

    /// With a bias `p/bias` [out] when `bias`.
    pub fn with_bias(p: nn::Path, inp: i64, out: i64, bias: bool) -> Linear {
        Linear {
            weight: p.var(
                "weight",
                &[out, inp],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: INITIALIZER_RANGE,
                },
            ),
            bias: bias.then(|| p.var("bias", &[out], nn::Init::Const(0.0))),
            fp8: None,
        }
    }

    /// A layer of given tensors (a fused projection's).
    pub fn of(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear {
            weight,
            bias,
            fp8: None,
        }
    }

    /// From now on the forward multiplies by `w` (this layer's weight in e4m3), and the weight's
    /// own memory is given back (a frozen model's, once loaded and final).
    pub fn use_fp8(&mut self, w: Fp8Weight) {
        let _g = tch::no_grad_guard();
        let empty = Tensor::empty([0], (self.weight.kind(), self.weight.device()));
        self.weight.set_data(&empty);
        self.fp8 = Some(w);
    }

    /// `use_fp8` with this layer's weight quantized, where it `fits` FP8's GEMM (else it stays).
    pub fn quantize_fp8(&mut self) {
        if Fp8Weight::fits(&self.weight) {
            self.use_fp8(Fp8Weight::quantize(&self.weight));
        }
    }

    /// The weight, where the layer is a plain one (no bias, not FP8) whose gradient `project`
    /// may accumulate in its GEMM.
    fn trained_weight(&self) -> Option<&Tensor> {
        (self.bias.is_none() && self.fp8.is_none()).then_some(&self.weight)
    }

    // [.., in] -> [.., out]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        if let Some(mut y) = self
            .trained_weight()
            .and_then(|w| crate::engine::gpu::cuda::project_into(x, &[w]))
        {
            return y.remove(0);
        }
        let y = match &self.fp8 {
            Some(w) => w.matmul(x),
            None => x.matmul(&self.weight.to_kind(x.kind()).tr()),
        };
        match &self.bias {
            Some(b) => y + b.to_kind(x.kind()),
            None => y,
        }
    }
}

/// `x` through each of `layers` (one input, several projections: q, k and v; gate and up). In a
/// drafter step that takes it (`cuda::project_into`), one op whose backward adds the weights'
/// gradients into their `.grad` with its GEMMs and sums the input's gradient the same way; else
/// each layer's forward.
// x [.., in] -> [.., out_j] each
pub fn project(x: &Tensor, layers: &[&Linear]) -> Vec<Tensor> {
    let weights: Option<Vec<&Tensor>> = layers.iter().map(|l| l.trained_weight()).collect();
    weights
        .and_then(|ws| crate::engine::gpu::cuda::project_into(x, &ws))
        .unwrap_or_else(|| layers.iter().map(|l| l.forward(x)).collect())
}

/// Qwen3 RMSNorm: normalise in fp32, scale, return in the input dtype.
#[derive(Debug)]
pub struct RmsNorm {
    pub weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    pub fn new(p: nn::Path, dim: i64, eps: f64) -> RmsNorm {
        RmsNorm {
            weight: p.var("weight", &[dim], nn::Init::Const(1.0)),
            eps,
        }
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// libtorch's rms_norm: one fused kernel (forward and backward) on CUDA, which normalises
    /// and scales in fp32 whatever the input's dtype and rounds once to it (transformers rounds
    /// before the scale as well: the two differ by bf16 rounding only).
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let dim = x.size().last().copied().unwrap_or(0);
        x.rms_norm([dim], Some(self.weight.to_kind(x.kind())), self.eps)
    }

    /// `x + delta` and it normalised: (sum, normalised sum), in one kernel where it can run: a
    /// frozen model's (`cuda::add_rms_norm`), or the drafter's op with its backward kernel
    /// (`cuda::add_rms_norm_trained`).
    pub fn add_forward(&self, x: &Tensor, delta: &Tensor) -> (Tensor, Tensor) {
        let frozen = !x.requires_grad() && !delta.requires_grad();
        let weight = (&self.weight, self.eps);
        let fused = if frozen {
            crate::engine::gpu::cuda::add_rms_norm(x, delta, weight)
        } else {
            crate::engine::gpu::cuda::add_rms_norm_trained(x, delta, weight)
        };
        fused.unwrap_or_else(|| {
            let sum = x + delta;
            let normed = self.forward(&sum);
            (sum, normed)
        })
    }
}

/// SwiGLU: down(silu(gate(x)) * up(x)).
#[derive(Debug)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    pub fn new(p: nn::Path, cfg: &Qwen3Config) -> Mlp {
        let (h, i, bias) = (cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias);
        Mlp {
            gate: Linear::with_bias(&p / "gate_proj", h, i, bias),
            up: Linear::with_bias(&p / "up_proj", h, i, bias),
            down: Linear::with_bias(&p / "down_proj", i, h, bias),
        }
    }

    /// Its three projections in FP8 (a frozen model's).
    pub fn quantize_fp8(&mut self) {
        for l in [&mut self.gate, &mut self.up, &mut self.down] {
            l.quantize_fp8();
        }
    }

    // [.., hidden] -> [.., hidden]
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let [gate, up]: [Tensor; 2] = project(x, &[&self.gate, &self.up])
            .try_into()
            .expect("two projections");
        // One pass where a kernel runs: a frozen model's forward, or the drafter's op with its
        // backward kernel.
        let fused = if gate.requires_grad() || up.requires_grad() {
            crate::engine::gpu::cuda::silu_mul_trained(&gate, &up)
        } else {
            crate::engine::gpu::cuda::silu_mul(&gate, &up)
        };
        self.down
            .forward(&fused.unwrap_or_else(|| gate.silu() * up))
    }
}

/// cos and sin for NeoX rotate-half RoPE at the given positions: each [.., head_dim], computed in
/// f32 and returned in `kind` (the activations' dtype, as transformers hands them over).
/// The sin table's first half comes negated: rotate-half is then a roll of the head by half its
/// width (`apply_rope`), one copy instead of a negation and a concatenation.
pub fn rope_tables(positions: &Tensor, head_dim: i64, rope: &Rope, kind: Kind) -> (Tensor, Tensor) {
    let inv_freq = inv_freq(head_dim, rope, positions.device());
    let freqs = positions.to_kind(Kind::Float).unsqueeze(-1) * inv_freq;
    let emb = Tensor::cat(&[&freqs, &freqs], -1);
    let sin = freqs.sin();
    let signed_sin = Tensor::cat(&[&sin.neg(), &sin], -1);
    (emb.cos().to_kind(kind), signed_sin.to_kind(kind))
}

/// The rotation frequencies theta^(-2i/d), i < d/2; with llama3 scaling, those of wavelength
/// above `original / low_freq_factor` divided by `factor`, those below `original /
/// high_freq_factor` kept, the ones between blended by where their wavelength lies.
// -> [head_dim / 2] f32
fn inv_freq(head_dim: i64, rope: &Rope, device: tch::Device) -> Tensor {
    let plain = Tensor::arange_start_step(0, head_dim, 2, (Kind::Float, device))
        .divide_scalar(head_dim as f64)
        .multiply_scalar(-rope.theta.ln())
        .exp();
    let Some(s) = rope.llama3 else {
        return plain;
    };
    let old = s.original_max_position_embeddings as f64;
    let wavelen = plain.reciprocal() * (2.0 * std::f64::consts::PI);
    let long = wavelen.gt(old / s.low_freq_factor);
    let short = wavelen.lt(old / s.high_freq_factor);
    let scaled = plain.where_self(&long.logical_not(), &(&plain / s.factor));
    let smooth = ((wavelen.reciprocal() * old) - s.low_freq_factor)
        / (s.high_freq_factor - s.low_freq_factor);
    let blended = (smooth.neg() + 1.0) * &scaled / s.factor + &smooth * &scaled;
    let medium = long.logical_or(&short).logical_not();
    blended.where_self(&medium, &scaled)
}

/// Applies RoPE to `x` with `rope_tables`' tables [batch, seq, head_dim]; `heads_axis` is where
/// `x` has its heads: 1 for [batch, heads, seq, head_dim], 2 for [batch, seq, heads, head_dim].
/// `x cos + rotate_half(x) sin`, where rotate_half(x) = [-x2, x1] is the roll of x by half the
/// head times the sign the sin table carries.
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor, heads_axis: i64) -> Tensor {
    let kind = x.kind();
    let cos = cos.unsqueeze(heads_axis).to_kind(kind);
    let sin = sin.unsqueeze(heads_axis).to_kind(kind);
    let half = x.size().last().copied().unwrap_or(0) / 2;
    (x * &cos).addcmul(&x.roll([half], [-1]), &sin)
}

/// Scaled dot-product attention with a boolean mask (true = attend) and GQA; rows the mask
/// blocks entirely come back as zeros, on every device.
// q [b, hq, lq, d], k/v [b, hkv, lk, d], mask [b, 1, lq, lk] -> [b, hq, lq, d]
pub fn masked_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> Tensor {
    let (safe, blocked) = prepare_mask(mask);
    attend(q, k, v, &safe, &blocked)
}

/// A boolean mask [.., lq, lk] made ready for `attend`: the mask with every key given to the rows
/// that see none, and those rows [.., lq, 1] (their output is cleared).
pub fn prepare_mask(mask: &Tensor) -> (Tensor, Tensor) {
    let blocked = mask.any_dim(-1, true).logical_not();
    (mask.logical_or(&blocked), blocked)
}

/// `masked_attention` with the mask prepared (`prepare_mask`). The CUDA kernels return NaN for a row that sees
/// nothing, and their backward then NaN gradients for q, k and v even under a zero output
/// gradient (padding anchors would make every step non-finite); such a row's output is cleared.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, blocked: &Tensor) -> Tensor {
    let out = Tensor::scaled_dot_product_attention(q, k, v, Some(mask), 0.0, false, None, true);
    out.masked_fill(blocked, 0.0)
}
