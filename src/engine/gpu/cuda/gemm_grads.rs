//! Weight gradients accumulated inside their GEMMs (src/engine/cxx/projection_ops.cpp): one
//! autograd op projects an input by several trained weights, and its backward adds each
//! weight's gradient into that weight's `.grad` with the GEMM itself and sums the input's
//! gradient the same way. Through autograd each weight gradient is a new tensor that
//! `AccumulateGrad` then adds to `.grad` (a pass that reads both and writes one), and the input's
//! gradients from q, k and v are added pair by pair.
//!
//! Taken only inside `with_gemm_grads` (a drafter step whose `.grad` are views of one zeroed buffer that
//! nothing hooks: a lone replica), where every weight has a `.grad` of its own kind and shape.

use crate::cuda_shim::{check, ffi, AVAILABLE};
use crate::engine::gpu::fast_paths::{on, FastPath, PathState};
use std::cell::Cell;
use std::ffi::c_void;
use tch::Tensor;

/// Whether the op ran in this process (libtorch's autograd, from its first failure on).
static STATE: PathState = PathState::untried();

thread_local! {
    /// Whether this thread is inside `with_gemm_grads`.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
}

/// "gemm" once the op ran, "autograd (failed: ...)" after it failed, else "autograd".
pub fn gemm_grads_state() -> String {
    STATE.describe("gemm", "autograd")
}

/// `f` with the weight gradients of its projections accumulated in their GEMMs on this thread
/// (unless `--disable gemm-grads`): for a step whose weights' `.grad` are zeroed before it and
/// read after it, and hooked by nothing.
pub fn with_gemm_grads<T>(f: impl FnOnce() -> T) -> T {
    crate::engine::gpu::fast_paths::for_a_while(&ACTIVE, |_| true, f)
}

/// `x` [.., in] projected by each of `weights` ([out_j, in], trained, of `x`'s kind), the
/// weights' gradients to be added into their `.grad` by backward's GEMMs; `None` where the op
/// does not run (outside `with_gemm_grads`, a weight with no `.grad` or of another kind, the shim not
/// built, a failure before): the caller projects with autograd's ops.
pub fn project_into(x: &Tensor, weights: &[&Tensor]) -> Option<Vec<Tensor>> {
    let wanted = ACTIVE.with(Cell::get) && on(FastPath::GemmGrads) && AVAILABLE;
    if !wanted || STATE.has_failed() || weights.is_empty() {
        return None;
    }
    let grads: Vec<Tensor> = weights.iter().map(|w| w.grad()).collect();
    let fits = weights.iter().zip(&grads).all(|(w, g)| {
        w.requires_grad()
            && w.kind() == x.kind()
            && g.defined()
            && g.kind() == w.kind()
            && g.size() == w.size()
            && g.is_contiguous()
    });
    if !fits {
        return None;
    }
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let mut ws: Vec<*mut c_void> = weights.iter().map(|w| p(w)).collect();
    let mut gs: Vec<*mut c_void> = grads.iter().map(p).collect();
    let mut out = vec![std::ptr::null_mut(); weights.len()];
    // SAFETY: live tensors (`at::Tensor*`) and arrays of `weights.len()` for the call; the shim
    // checks shapes and kinds, and on success hands over that many heap-allocated tensors.
    let status = unsafe {
        ffi::dflash_project_into(
            p(x),
            ws.as_mut_ptr(),
            gs.as_mut_ptr(),
            weights.len() as i32,
            out.as_mut_ptr(),
        )
    };
    STATE
        .took(check(status, "weight gradients in their GEMMs"))
        .then(|| {
            out.into_iter()
                // SAFETY: each a heap-allocated `at::Tensor` the shim handed over.
                .map(|t| unsafe { Tensor::from_ptr(t as *mut torch_sys::C_tensor) })
                .collect()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Inside `with_gemm_grads`, two projections of one input (the CPU's GEMMs, f32) give
    /// autograd's outputs, the input autograd's gradient, and each weight's gradient added into
    /// the `.grad` it had (a second backward doubles it: added, not overwritten), with no
    /// gradient reaching a weight through autograd, and outputs that take in-place ops; outside
    /// it, or for a weight with no `.grad`, the op is not taken.
    #[test]
    fn projections_accumulate_the_weights_gradients_in_their_gemms() {
        if !AVAILABLE {
            eprintln!("no CUDA shim in this build: the op is not built");
            return;
        }
        tch::manual_seed(3);
        let opts = (Kind::Float, Device::Cpu);
        let x0 = Tensor::randn([2, 5, 6], opts);
        let w0 = [Tensor::randn([4, 6], opts), Tensor::randn([3, 6], opts)];
        let dys = [
            Tensor::randn([2, 5, 4], opts),
            Tensor::randn([2, 5, 3], opts),
        ];
        // autograd's gradients of x and of each weight for sum(y_j * dy_j)
        let leaf = |t: &Tensor| t.detach().copy().set_requires_grad(true);
        let (x, ws) = (leaf(&x0), w0.each_ref().map(leaf));
        let loss = |ys: &[Tensor]| {
            ys.iter()
                .zip(&dys)
                .map(|(y, dy)| (y * dy).sum(Kind::Float))
                .fold(Tensor::zeros([], opts), |a, b| a + b)
        };
        let expected: Vec<Tensor> = ws.iter().map(|w| x.matmul(&w.tr())).collect();
        loss(&expected).backward();
        let (dx_ref, dw_ref) = (x.grad(), ws.each_ref().map(Tensor::grad));

        let (x, ws) = (leaf(&x0), w0.each_ref().map(leaf));
        let refs: Vec<&Tensor> = ws.iter().collect();
        assert!(project_into(&x, &refs).is_none(), "outside with_gemm_grads");
        assert!(
            with_gemm_grads(|| project_into(&x, &refs)).is_none(),
            "weights with no .grad"
        );
        let slots = ws.each_ref().map(|w| w.zeros_like());
        for (w, g) in ws.iter().zip(&slots) {
            crate::engine::gpu::cuda::set_grad(w, g).unwrap();
        }
        for pass in 1..=2 {
            let ys = with_gemm_grads(|| project_into(&x, &refs)).expect("the op ran");
            for (y, e) in ys.iter().zip(&expected) {
                assert!(y.allclose(e, 1e-5, 1e-5, false), "outputs");
            }
            // Plain outputs, not views of the op's own tensors: they take in-place ops.
            let mut y0 = ys[0].shallow_clone();
            assert!(y0.f_mul_scalar_(1.0).is_ok(), "an in-place op on an output");
            loss(&ys).backward();
            let scale = pass as f64;
            assert!(x.grad().allclose(&(&dx_ref * scale), 1e-4, 1e-4, false));
            for ((w, slot), r) in ws.iter().zip(&slots).zip(&dw_ref) {
                assert!(
                    slot.allclose(&(r * scale), 1e-4, 1e-4, false),
                    "pass {pass}"
                );
                assert_eq!(w.grad().data_ptr(), slot.data_ptr(), "the same .grad");
            }
        }
        assert_eq!(gemm_grads_state(), "gemm");
    }
}
