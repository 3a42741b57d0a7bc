//! The AdamW step through fused CUDA kernels: libtorch's fused AdamW over f32 masters, or our
//! kernel for bf16 weights beside them (src/engine/cxx/optimizer_kernels.cpp; f32 or bf16
//! moments), with libtorch's kernel over widened gradients standing in where ours cannot run.

use super::moments::MomentPrecision;
use super::AdamW;
use tch::{Kind, Tensor};

/// Whether the AdamW kernel for bf16 weights ran in this process (libtorch's fused kernel over
/// widened gradients from the first failure on).
static BF16_KERNEL: crate::engine::gpu::fast_paths::PathState =
    crate::engine::gpu::fast_paths::PathState::untried();

/// "kernel" once the AdamW kernel for bf16 weights ran, "ops (failed: ...)" after it failed,
/// else "ops" (no drafter with bf16 weights stepped on a GPU).
pub fn bf16_kernel_state() -> String {
    BF16_KERNEL.describe("kernel", "ops")
}

/// What stands in for the AdamW kernel for bf16 weights where it cannot run: libtorch's fused
/// AdamW over the gradients widened to f32, then the working weights rounded from the masters
/// (two passes and an f32 gradient buffer more). Arguments as `cuda::adamw_bf16`'s; false where
/// libtorch's kernel did not run either.
pub(super) fn widened_adamw(
    (master, grad): (&Tensor, &Tensor),
    (m, v): (&Tensor, &Tensor),
    work: &Tensor,
    (hyper, t): (&crate::engine::gpu::cuda::AdamWHyper, f64),
    divisor: Option<&Tensor>,
    found_inf: Option<&Tensor>,
) -> bool {
    let step = Tensor::full([], t, (Kind::Float, master.device()));
    let grad = grad.to_kind(Kind::Float);
    let state = crate::engine::gpu::cuda::AdamWState {
        param: master,
        grad: &grad,
        m,
        v,
        step: &step,
    };
    if crate::engine::gpu::cuda::fused_adamw(&state, hyper, divisor, found_inf).is_err() {
        return false;
    }
    work.shallow_clone().copy_(master);
    true
}

impl AdamW {
    /// The step through libtorch's fused CUDA kernel (each element read and written once; the
    /// gate as its `found_inf`, the clipping as its `grad_scale`, a divisor); false where it does
    /// not run (CPU, no shim, or `--disable fused-adamw` for side-by-side measurements), and
    /// the plain path runs.
    pub(super) fn fused(
        &self,
        g: &Tensor,
        lr: f64,
        t: f64,
        ok: Option<&Tensor>,
        divisor: Option<&Tensor>,
    ) -> bool {
        // libtorch's fused kernel keeps f32 moments; bf16 ones step in our kernel over bf16
        // weights, else in the plain path.
        let bf16_moments = self.moments == MomentPrecision::Bf16;
        if !self.fused_step || (bf16_moments && self.working.is_none()) {
            return false;
        }
        let found_inf = ok.map(|ok| ok.logical_not().to_kind(Kind::Float));
        let hyper = crate::engine::gpu::cuda::AdamWHyper {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            weight_decay: self.weight_decay,
            eps: self.eps,
        };
        if let Some(work) = &self.working {
            return self.step_bf16(work, g, (&hyper, t), divisor, found_inf.as_ref());
        }
        let step = Tensor::full([], t, (Kind::Float, self.flat.device()));
        let state = crate::engine::gpu::cuda::AdamWState {
            param: &self.flat,
            grad: g,
            m: &self.m,
            v: &self.v,
            step: &step,
        };
        crate::engine::gpu::cuda::fused_adamw(&state, &hyper, divisor, found_inf.as_ref()).is_ok()
    }

    /// The fused step over bf16 working weights: our kernel (bf16 gradients in, the masters,
    /// moments and working weights out, one pass), or where it cannot run libtorch's fused
    /// kernel over the gradients widened to f32 and the working weights rounded after (f32
    /// moments only); false where neither ran (the plain path runs).
    fn step_bf16(
        &self,
        work: &Tensor,
        g: &Tensor,
        (hyper, t): (&crate::engine::gpu::cuda::AdamWHyper, f64),
        divisor: Option<&Tensor>,
        found_inf: Option<&Tensor>,
    ) -> bool {
        let (weights, moments, at) = ((&self.flat, g), (&self.m, &self.v), (hyper, t));
        if !BF16_KERNEL.has_failed() {
            match crate::engine::gpu::cuda::adamw_bf16(
                weights, moments, work, at, divisor, found_inf,
            ) {
                Ok(()) => {
                    // A failure elsewhere (another replica's) stays the state.
                    if !BF16_KERNEL.has_failed() {
                        BF16_KERNEL.ran();
                    }
                    return true;
                }
                Err(e) => BF16_KERNEL.failed(&e),
            }
        }
        if self.moments == MomentPrecision::Bf16 {
            return false;
        }
        widened_adamw(weights, moments, work, at, divisor, found_inf)
    }
}
