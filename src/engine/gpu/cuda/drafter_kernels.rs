//! Kernels of our own in the drafter's training step (src/engine/cxx/target_kernels.cpp, compiled
//! at run time with NVRTC), each an autograd op of one pass forward and one backward:
//! - the q/k RMSNorm and RoPE of each head, differentiable in the activations and the trained
//!   norm weight. Unfused they are a norm, a multiply, a roll and a multiply-add forward and
//!   about twice that backward, each a full pass over q (67 MB a layer at 8B shapes);
//! - the MLP's silu(gate) x up: unfused a silu and a multiply forward, two multiplies and silu's
//!   backward after, over [rows, intermediate] (201 MB a layer at 8B shapes), with silu(gate)
//!   kept for the backward besides gate and up.
//! - a residual add and the RMSNorm after it (the trained norm weight too): backward adds the
//!   gradient the sum gets from the residual stream in the pass that takes the norm's, where
//!   autograd adds the two after, and the weight's gradient in the same pass;
//! - the loss over a chunk of logits (src/engine/cxx/loss_kernels.cpp): the probabilities
//!   written over the logits as their gradient, each row's negative log-likelihood and whether
//!   its argmax is the label, in two passes where the ops take five.
//!
//! Each returns `None` where it cannot run, and the caller runs the ops.

use super::{adopt, check, ffi, AVAILABLE};
use crate::engine::gpu::fast_paths::PathState;
use std::ffi::c_void;
use tch::{Kind, Tensor};

/// Whether the drafter's kernels ran in this process (the ops, all four, from the first
/// failure of any on).
static STATE: PathState = PathState::untried();

/// "kernels" once they ran, "ops (failed: ...)" after one failed, else "ops".
pub fn drafter_kernels_state() -> String {
    STATE.describe("kernels", "ops")
}

/// Whether the drafter's kernels may take these tensors: bf16 on CUDA, the shim built, none
/// failed before, and not turned off (`--disable drafter-kernels`).
fn usable(ts: &[&Tensor]) -> bool {
    use crate::engine::gpu::fast_paths::{on, FastPath};
    on(FastPath::DrafterKernels)
        && AVAILABLE
        && !STATE.has_failed()
        && ts
            .iter()
            .all(|t| t.kind() == Kind::BFloat16 && t.device().is_cuda())
}

/// Whether `t`'s data starts on 16 bytes: the kernels read 8 bf16 at a time, and a view at an
/// odd offset takes the ops (the shim would refuse it, and a failure turns every kernel here off).
fn aligned(t: &Tensor) -> bool {
    (t.data_ptr() as usize).is_multiple_of(16)
}

/// The loss of rows of `logits` [rows, vocab] (bf16 on CUDA, contiguous, vocab a multiple of
/// 8) against `labels` [rows] (int64, each a token of the vocabulary): `logits` becomes `p -
/// onehot(label)` in place, the label's entry written as minus the sum of the others' (see
/// src/engine/train/loss.rs); gives (nll [rows] f32, hit [rows] bool: argmax == label). `None`,
/// `logits` untouched, where it cannot run (see `usable`): the caller runs the ops.
pub fn loss_rows(logits: &mut Tensor, labels: &Tensor) -> Option<(Tensor, Tensor)> {
    let shape = logits.size();
    let fits = shape.len() == 2
        && shape[1] > 0
        && shape[1] % 8 == 0
        && logits.is_contiguous()
        && aligned(logits)
        && labels.kind() == Kind::Int64
        && labels.size() == [shape[0]];
    if !fits || !usable(&[logits]) {
        return None;
    }
    let labels = labels.contiguous();
    let nll = Tensor::empty([shape[0]], (Kind::Float, logits.device()));
    let hit = Tensor::empty([shape[0]], (Kind::Bool, logits.device()));
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe { ffi::dflash_loss_rows(p(logits), p(&labels), p(&nll), p(&hit)) };
    STATE
        .took(check(status, "the drafter's loss kernel"))
        .then_some((nll, hit))
}

/// `silu(gate) * up` (bf16 on CUDA, one shape, a multiple of 8 elements), differentiable in
/// both; `None` where it cannot run (see `usable`): the caller runs the ops.
pub fn silu_mul_trained(gate: &Tensor, up: &Tensor) -> Option<Tensor> {
    let fits = gate.size() == up.size() && gate.numel().is_multiple_of(8);
    if !fits || !usable(&[gate, up]) {
        return None;
    }
    let (gate, up) = (gate.contiguous(), up.contiguous());
    if !aligned(&gate) || !aligned(&up) {
        return None;
    }
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe { ffi::dflash_silu_mul_trained(p(&gate), p(&up), &mut out) };
    adopt(&STATE, status, out, "the drafter's silu * up kernels")
}

/// `x + delta` and it through an RMSNorm over the last axis (`weight` [cols], trained, and
/// `eps`): (sum, normed), both differentiable in all three (bf16 on CUDA, one shape [.., cols],
/// cols a multiple of 8 up to 8,192). Backward takes the norm's gradient and the one the sum
/// gets elsewhere (the residual stream) in one pass. `None` where it cannot run (see
/// `usable`): the caller runs the ops.
pub fn add_rms_norm_trained(
    x: &Tensor,
    delta: &Tensor,
    (weight, eps): (&Tensor, f64),
) -> Option<(Tensor, Tensor)> {
    let cols = x.size().last().copied().unwrap_or(0);
    let fits = x.size() == delta.size()
        && cols > 0
        && cols % 8 == 0
        && cols <= 8192
        && weight.numel() as i64 == cols;
    if !fits || !usable(&[x, delta]) {
        return None;
    }
    let weight = weight.to_kind(Kind::BFloat16);
    let (x, delta) = (x.contiguous(), delta.contiguous());
    if !aligned(&x) || !aligned(&delta) || !aligned(&weight) {
        return None;
    }
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let (mut sum, mut out) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe {
        ffi::dflash_add_rms_norm_trained(p(&x), p(&delta), p(&weight), eps, &mut sum, &mut out)
    };
    let sum = adopt(&STATE, status, sum, "the drafter's add + RMSNorm kernels")?;
    // SAFETY: on success the shim handed over a second heap-allocated `at::Tensor`.
    let out = unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) };
    Some((sum, out))
}

/// `x` [.., tokens, heads, 128] (contiguous, bf16 on CUDA) through an RMSNorm over each head
/// (`weight` [128], trained, and `eps`) and rotated with the `rope_tables` tables `cos`, `sin`
/// [.., tokens, 128]: what `apply_rope(norm(x))` gives, differentiable in `x` and `weight`.
/// `None` where it cannot run (the shim not built, not bf16 on CUDA, heads not of 128, a failure
/// before, or `--disable drafter-kernels`): the caller runs the ops.
pub fn norm_rope_trained(
    x: &Tensor,
    (weight, eps): (&Tensor, f64),
    (cos, sin): (&Tensor, &Tensor),
) -> Option<Tensor> {
    let shape = x.size();
    let fits = shape.len() >= 3 && shape.last() == Some(&128) && weight.numel() == 128;
    if !fits || !usable(&[x, cos, sin]) {
        return None;
    }
    let (x, cos, sin) = (x.contiguous(), cos.contiguous(), sin.contiguous());
    let weight = weight.to_kind(Kind::BFloat16);
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status = unsafe {
        ffi::dflash_norm_rope_trained(p(&x), p(&weight), p(&cos), p(&sin), eps, &mut out)
    };
    adopt(&STATE, status, out, "the drafter's norm + RoPE kernels")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::layers::{apply_rope, rope_tables};
    use crate::engine::model::shapes::Rope;

    /// Relative distance of `a` from `reference` (f32 norms).
    fn rel(a: &Tensor, reference: &Tensor) -> f64 {
        let r = reference.to_kind(Kind::Float);
        f64::try_from((a.to_kind(Kind::Float) - &r).norm() / r.norm()).unwrap()
    }

    /// Each of (out, the gradients) of the kernels within bf16's rounding of the f32 ops, and
    /// no further off than the bf16 ops.
    fn assert_near(what: &str, kernel: &[Tensor], ops: &[Tensor], reference: &[Tensor]) {
        let names = ["out", "first gradient", "second gradient"];
        for (i, ((k, o), r)) in kernel.iter().zip(ops).zip(reference).enumerate() {
            let (kernel_gap, ops_gap) = (rel(k, r), rel(o, r));
            assert!(
                kernel_gap < 1e-2 && kernel_gap <= 2.0 * ops_gap + 1e-3,
                "{what}, {}: kernel {kernel_gap:.2e} off, ops {ops_gap:.2e}",
                names[i]
            );
        }
    }

    /// silu(gate) * up and the gradients of gate and up, the kernels against libtorch's bf16
    /// ops and both against the ops in f32 (see `assert_near`): a dropped term of silu's
    /// derivative, or the two gradients swapped, is off by far more. Gate values from -8 to 8
    /// (sigmoid saturating at both ends), a size not a multiple of a block's 2,048 elements.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_drafter_silu_mul_kernels_give_the_ops_and_their_gradients_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the drafter's silu * up kernels") else {
            return;
        };
        tch::manual_seed(13);
        let shape = [3, 41, 96];
        let g32 = Tensor::rand(shape, (Kind::Float, dev)) * 16.0 - 8.0;
        let u32 = Tensor::randn(shape, (Kind::Float, dev)) * 2.0;
        let dy32 = Tensor::randn(shape, (Kind::Float, dev));
        let grads = |kind: Kind, kernel: bool| {
            let g = g32.detach().to_kind(kind).set_requires_grad(true);
            let u = u32.detach().to_kind(kind).set_requires_grad(true);
            let out = if kernel {
                silu_mul_trained(&g, &u)
                    .unwrap_or_else(|| panic!("did not run: {}", drafter_kernels_state()))
            } else {
                g.silu() * &u
            };
            (&out * dy32.to_kind(kind)).sum(Kind::Float).backward();
            [out.detach(), g.grad(), u.grad()]
        };
        let reference = grads(Kind::Float, false);
        let ops = grads(Kind::BFloat16, false);
        let kernel = grads(Kind::BFloat16, true);
        assert_near("silu * up", &kernel, &ops, &reference);
    }

    /// The sum and the normed sum of the add + RMSNorm kernels, and the gradients of x, delta
    /// and the weight, against libtorch's bf16 ops and both against the ops in f32 (see
    /// `assert_near`): with the sum used elsewhere too (its gradient added in the kernel's pass)
    /// and not. The residual's gradient dropped, the norm's backward missing a term, or the
    /// weight's gradient summed over the wrong rows is off by far more; the weight's gradient is
    /// the same bit for bit on a second backward. Rows of 1,000 (chunks of 2,048 cut short),
    /// 4,096 and 8,192 (the widest), row counts not a multiple of the grid.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_drafter_add_rms_norm_kernels_give_the_ops_and_their_gradients_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the drafter's add + RMSNorm kernels") else {
            return;
        };
        tch::manual_seed(14);
        for (rows, cols, sum_used) in [(37, 1000, true), (600, 4096, true), (45, 8192, false)] {
            let x32 = Tensor::randn([1, rows, cols], (Kind::Float, dev)) * 2.0;
            let d32 = Tensor::randn([1, rows, cols], (Kind::Float, dev));
            let w32 = Tensor::rand([cols], (Kind::Float, dev)) + 0.5;
            let (ds32, dy32) = (
                Tensor::randn([1, rows, cols], (Kind::Float, dev)),
                Tensor::randn([1, rows, cols], (Kind::Float, dev)),
            );
            let grads = |kind: Kind, kernel: bool| {
                let leaf = |t: &Tensor| t.detach().to_kind(kind).set_requires_grad(true);
                let (x, d, w) = (leaf(&x32), leaf(&d32), leaf(&w32));
                let (sum, out) = if kernel {
                    add_rms_norm_trained(&x, &d, (&w, 1e-6))
                        .unwrap_or_else(|| panic!("did not run: {}", drafter_kernels_state()))
                } else {
                    let sum = &x + &d;
                    let out = sum.rms_norm([cols], Some(&w), 1e-6);
                    (sum, out)
                };
                let mut loss = (&out * dy32.to_kind(kind)).sum(Kind::Float);
                if sum_used {
                    loss += (&sum * ds32.to_kind(kind)).sum(Kind::Float);
                }
                loss.backward();
                [sum.detach(), out.detach(), x.grad(), d.grad(), w.grad()]
            };
            let reference = grads(Kind::Float, false);
            let ops = grads(Kind::BFloat16, false);
            let kernel = grads(Kind::BFloat16, true);
            let what = format!("add + RMSNorm over {rows}x{cols}");
            // sum and out, then x's gradient with the weight's; d's is x's.
            assert_near(&what, &kernel[..3], &ops[..3], &reference[..3]);
            assert_near(&what, &kernel[3..], &ops[3..], &reference[3..]);
            let again = grads(Kind::BFloat16, true);
            assert!(
                again[4].equal(&kernel[4]),
                "{what}: the weight's gradient again"
            );
        }
    }

    /// The output and both gradients (of x and of the norm weight) of the one-pass kernels, and
    /// of libtorch's bf16 ops they replace, each against the same ops in f32: the kernels are
    /// within bf16's rounding, and no further off than the bf16 ops. A rotation by the wrong
    /// partner, a sign, a missed term of the norm's backward or a weight gradient summed over
    /// the wrong rows is off by far more. The weight's gradient is the same bit for bit on a
    /// second backward (its partial sums are added in a fixed order). Shapes: 3 heads (not a
    /// power of two) and 8, rows not a multiple of a block's 8 warps.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_drafter_norm_rope_kernels_give_the_ops_and_their_gradients_on_cuda() {
        let Some(dev) = super::super::cuda_or_skip("the drafter's norm + RoPE kernels") else {
            return;
        };
        tch::manual_seed(12);
        let rope = Rope::plain(1_000_000.0);
        for (b, tokens, heads) in [(2, 37, 3), (1, 300, 8)] {
            let x32 = Tensor::randn([b, tokens, heads, 128], (Kind::Float, dev)) * 3.0;
            let w32 = Tensor::rand([128], (Kind::Float, dev)) + 0.5;
            let dy32 = Tensor::randn([b, tokens, heads, 128], (Kind::Float, dev));
            let pos = Tensor::arange(tokens, (Kind::Int64, dev))
                .unsqueeze(0)
                .repeat([b, 1])
                * 7;
            let (cos, sin) = rope_tables(&pos, 128, &rope, Kind::BFloat16);
            let bf16 = Kind::BFloat16;
            // (out, dx, dw) of `run` on leaves made from the f32 values in `kind`.
            let grads = |kind: Kind, kernel: bool| {
                let x = x32.detach().to_kind(kind).set_requires_grad(true);
                let w = w32.detach().to_kind(kind).set_requires_grad(true);
                let out = if kernel {
                    norm_rope_trained(&x, (&w, 1e-6), (&cos, &sin))
                        .unwrap_or_else(|| panic!("did not run: {}", drafter_kernels_state()))
                } else {
                    let n = x.rms_norm([128], Some(&w), 1e-6);
                    apply_rope(&n, &cos.to_kind(kind), &sin.to_kind(kind), 2)
                };
                (&out * dy32.to_kind(kind)).sum(Kind::Float).backward();
                [out.detach(), x.grad(), w.grad()]
            };
            let reference = grads(Kind::Float, false);
            let ops = grads(bf16, false);
            let kernel = grads(bf16, true);
            let what = format!("norm + RoPE at {b}x{tokens}x{heads}");
            assert_near(&what, &kernel, &ops, &reference);
            let again = grads(bf16, true);
            assert!(again[1].equal(&kernel[1]) && again[2].equal(&kernel[2]));
        }
    }
}
