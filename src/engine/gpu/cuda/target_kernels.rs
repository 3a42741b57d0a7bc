//! Kernels of our own for the frozen target's forward (src/engine/cxx/target_kernels.cpp,
//! compiled at run time with NVRTC): the q/k RMSNorm with RoPE, silu(gate) x up, and a residual
//! add with the RMSNorm after it, each in one pass. Each returns `None` where it cannot run, and
//! the caller runs the ops it replaces.

use super::{check, ffi, AVAILABLE};
use crate::engine::gpu::fast_paths::PathState;
use std::ffi::{c_int, c_void};
use tch::Tensor;

/// Whether the target's kernels ran in this process (the ops from the first failure on).
static STATE: PathState = PathState::untried();

/// "kernels" once the target's kernels ran, "ops (failed: ...)" after one failed, else "ops".
pub fn target_kernels_state() -> String {
    STATE.describe("kernels", "ops")
}

/// Whether the target's kernels may run on tensors like `x`: the shim built, bf16 on CUDA, none
/// failed before, and not turned off (`--disable target-kernels`, for side-by-side runs).
fn target_kernels_for(x: &Tensor) -> bool {
    use crate::engine::gpu::fast_paths::{on, FastPath};
    on(FastPath::TargetKernels)
        && AVAILABLE
        && !STATE.has_failed()
        && x.kind() == tch::Kind::BFloat16
        && x.device().is_cuda()
}

/// `out` after a target kernel's launch: `None` (and no kernel from then on) when it failed.
fn target_kernel_ran(status: c_int, what: &str, out: Tensor) -> Option<Tensor> {
    STATE.took(check(status, what)).then_some(out)
}

/// The attention's q or k RMSNorm and RoPE in one kernel: for `heads` heads of 128 starting at
/// feature `col0` of every token of `x` (bf16, contiguous, [.., tokens, features]), normalised
/// with `weight` [128] and `eps`, rotated with the `rope_tables` tables [.., tokens, 128];
/// [.., tokens, heads, 128]. `None` where it cannot run (see `target_kernels_for`): the caller
/// runs the ops.
pub fn norm_rope(
    x: &Tensor,
    (col0, heads): (i64, i64),
    (weight, eps): (&Tensor, f64),
    (cos, sin): (&Tensor, &Tensor),
) -> Option<Tensor> {
    if !target_kernels_for(x) || !target_kernels_for(cos) || !target_kernels_for(sin) {
        return None;
    }
    let mut shape = x.size();
    shape.pop();
    shape.extend([heads, 128]);
    let out = Tensor::empty(shape, (tch::Kind::BFloat16, x.device()));
    let weight = weight.to_kind(tch::Kind::BFloat16);
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe {
        ffi::dflash_norm_rope(p(x), col0, heads, p(&weight), p(cos), p(sin), p(&out), eps)
    };
    target_kernel_ran(status, "the q/k norm + RoPE kernel", out)
}

/// `silu(gate) * up` in one pass (bf16 on CUDA, contiguous, one shape); `None` where it cannot
/// run (see `target_kernels_for`, and sizes not a multiple of 8): the caller runs the ops.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Option<Tensor> {
    let fits = gate.size() == up.size() && gate.numel().is_multiple_of(8);
    if !fits || !target_kernels_for(gate) || !target_kernels_for(up) {
        return None;
    }
    let (gate, up) = (gate.contiguous(), up.contiguous());
    let out = gate.empty_like();
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe { ffi::dflash_silu_mul(p(&gate), p(&up), p(&out)) };
    target_kernel_ran(status, "the silu * up kernel", out)
}

/// `x + delta` and it through an RMSNorm (`weight` over the last axis, `eps`) in one pass: (the
/// sum, the normalised sum), rounded where the add and libtorch's fused rms_norm round. bf16 on
/// CUDA, one shape, rows a multiple of 8 wide; `None` where it cannot run (see
/// `target_kernels_for`): the caller runs the ops.
pub fn add_rms_norm(
    x: &Tensor,
    delta: &Tensor,
    (weight, eps): (&Tensor, f64),
) -> Option<(Tensor, Tensor)> {
    let cols = x.size().last().copied().unwrap_or(0);
    let fits =
        x.size() == delta.size() && cols > 0 && cols % 8 == 0 && weight.numel() as i64 == cols;
    if !fits || !target_kernels_for(x) || !target_kernels_for(delta) {
        return None;
    }
    let (x, delta) = (x.contiguous(), delta.contiguous());
    let weight = weight.to_kind(tch::Kind::BFloat16).contiguous();
    let (sum, out) = (x.empty_like(), x.empty_like());
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status =
        unsafe { ffi::dflash_add_rms_norm(p(&x), p(&delta), p(&weight), p(&sum), p(&out), eps) };
    target_kernel_ran(status, "the add + RMSNorm kernel", out).map(|out| (sum, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::layers::{apply_rope, RmsNorm};
    use tch::{nn, Kind};

    /// Fails a kernel test whose kernel did not run, with what the kernels' state says.
    fn kernel_failed<T>() -> T {
        panic!("the kernel did not run: {}", target_kernels_state())
    }

    /// The one-pass silu(gate) * up kernel against the two ops. Skipped without a GPU and the
    /// CUDA shim.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_silu_mul_kernel_gives_the_ops_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the silu * up kernel") else {
            return;
        };
        tch::manual_seed(10);
        let bf16 = Kind::BFloat16;
        let rand = || (Tensor::randn([3, 40, 96], (Kind::Float, dev)) * 4.0).to_kind(bf16);
        let (gate, up) = (rand(), rand());
        let ops = gate.silu() * &up;
        let kernel = silu_mul(&gate, &up).unwrap_or_else(kernel_failed);
        let gap = f64::try_from((&kernel - &ops).abs().max().to_kind(Kind::Float)).unwrap();
        let top = f64::try_from(ops.abs().max().to_kind(Kind::Float)).unwrap();
        assert!(gap <= top / 128.0, "apart by {gap} (largest {top})");
    }

    /// The add + RMSNorm kernel against the ops it replaces (a bf16 add, then libtorch's
    /// rms_norm): the sum to the bit, the normalised sum within bf16 rounding; on rows narrower
    /// than a block's 256 x 8 elements and on rows of two passes. Skipped without a GPU and the
    /// CUDA shim.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_add_and_norm_kernel_gives_the_ops_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the add + RMSNorm kernel") else {
            return;
        };
        tch::manual_seed(11);
        let bf16 = Kind::BFloat16;
        for cols in [1000, 4096] {
            let rand = || (Tensor::randn([2, 33, cols], (Kind::Float, dev)) * 3.0).to_kind(bf16);
            let (x, delta) = (rand(), rand());
            let vs = nn::VarStore::new(dev);
            let norm = RmsNorm::new(vs.root() / "norm", cols, 1e-6);
            let (sum_ops, normed_ops) = tch::no_grad(|| {
                let mut w = norm.weight.shallow_clone();
                w.copy_(&(Tensor::rand([cols], (Kind::Float, dev)) + 0.5));
                let sum = &x + &delta;
                let normed = norm.forward(&sum);
                (sum, normed)
            });
            let (sum, normed) =
                add_rms_norm(&x, &delta, (&norm.weight, 1e-6)).unwrap_or_else(kernel_failed);
            assert!(sum.equal(&sum_ops), "{cols} wide: the sums differ");
            assert_eq!(normed.size(), normed_ops.size());
            let gap = (&normed - &normed_ops).abs().to_kind(Kind::Float);
            let bound = normed_ops.abs().to_kind(Kind::Float) / 128.0 + 1e-6;
            let over = i64::try_from(gap.gt_tensor(&bound).sum(Kind::Int64)).unwrap();
            assert_eq!(
                over, 0,
                "{cols} wide: {over} elements apart by more than bf16 rounding"
            );
        }
    }

    /// The fused q/k norm + RoPE kernel against the ops it replaces (rms_norm, then the rotation
    /// of `apply_rope`), on q's and k's heads of a fused projection. Skipped without a GPU and
    /// the CUDA shim.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_norm_and_rope_kernel_gives_the_ops_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the norm + RoPE kernel") else {
            return;
        };
        tch::manual_seed(9);
        let bf16 = Kind::BFloat16;
        let (b, s, heads, kv_heads) = (2, 96, 4, 2);
        let qkv = (Tensor::randn([b, s, (heads + 2 * kv_heads) * 128], (Kind::Float, dev)) * 3.0)
            .to_kind(bf16);
        let pos = Tensor::arange(s, (Kind::Int64, dev))
            .unsqueeze(0)
            .repeat([b, 1])
            * 7;
        let (cos, sin) = crate::engine::model::layers::rope_tables(
            &pos,
            128,
            &crate::engine::model::shapes::Rope::plain(1e6),
            bf16,
        );
        let vs = nn::VarStore::new(dev);
        let norm = RmsNorm::new(vs.root() / "norm", 128, 1e-6);
        tch::no_grad(|| {
            let mut w = norm.weight.shallow_clone();
            w.copy_(&(Tensor::rand([128], (Kind::Float, dev)) + 0.5));
        });
        for (col0, n) in [(0, heads), (heads * 128, kv_heads)] {
            let part = qkv.narrow(2, col0, n * 128).view([b, s, n, 128]);
            let ops = tch::no_grad(|| apply_rope(&norm.forward(&part), &cos, &sin, 2));
            let kernel = norm_rope(&qkv, (col0, n), (&norm.weight, 1e-6), (&cos, &sin))
                .unwrap_or_else(kernel_failed);
            assert_eq!(kernel.size(), ops.size());
            let gap = f64::try_from((&kernel - &ops).abs().max().to_kind(Kind::Float)).unwrap();
            let top = f64::try_from(ops.abs().max().to_kind(Kind::Float)).unwrap();
            assert!(
                gap <= top / 128.0,
                "heads from {col0}: apart by {gap} (largest {top})"
            );
        }
    }
}
