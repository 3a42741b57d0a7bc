//! The AdamW step in libtorch's ops (the CPU, or where no fused kernel runs): over the whole
//! buffers with f32 moments, a span at a time with bf16 ones.

use super::AdamW;
use tch::Tensor;

/// What the plain step's spans share: the learning rate, the bias corrections and the gate
/// (1.0 or 0.0 on the device, where the step is gated).
pub(super) struct PlainStep<'a> {
    pub lr: f64,
    pub bc1: f64,
    pub bc2: f64,
    pub gate: Option<&'a Tensor>,
}

/// Elements a span of the plain step with bf16 moments (64 MiB of f32 each moment).
pub(super) const SPAN_ELEMENTS: i64 = 1 << 24;

impl AdamW {
    /// The plain step over one span: `flat` (the masters), `g` (f32 gradients, clipped and
    /// gated), `m` and `v` (f32) of one length, updated in place.
    pub(super) fn plain_span(
        &self,
        flat: &mut Tensor,
        g: &Tensor,
        (m, v): (&mut Tensor, &mut Tensor),
        at: &PlainStep,
    ) {
        match at.gate {
            Some(k) => {
                let _ = m.lerp_tensor_(g, &(k * (1.0 - self.beta1)));
                let _ = v.lerp_tensor_(&(g * g), &(k * (1.0 - self.beta2)));
            }
            None => {
                let _ = m.lerp_(g, 1.0 - self.beta1);
                let _ = v.lerp_(&(g * g), 1.0 - self.beta2);
            }
        }
        if self.weight_decay > 0.0 {
            let decay = at.lr * self.weight_decay;
            match at.gate {
                Some(k) => {
                    let _ = flat.g_mul_(&(k * -decay + 1.0));
                }
                None => {
                    let _ = flat.g_mul_scalar_(1.0 - decay);
                }
            }
        }
        let denom = (v.sqrt() / at.bc2.sqrt()) + self.eps;
        let delta = &*m / denom * (at.lr / at.bc1);
        let _ = match at.gate {
            Some(k) => flat.g_sub_(&(delta * k)),
            None => flat.g_sub_(&delta),
        };
    }
}
