//! What the optimizer's flat path asks of the shim: a parameter's gradient kept as a view of one
//! flat buffer (`set_grad`), AdamW over the flat parameters in libtorch's fused CUDA kernel
//! (`fused_adamw`), and AdamW over f32 masters with bf16 gradients and weights in one kernel of
//! our own (`adamw_bf16`, src/engine/cxx/optimizer_kernels.cpp; its moments f32 or bf16).

use super::{check, ffi};
use anyhow::Result;
use std::ffi::c_void;
use tch::Tensor;

/// Makes `grad` (shaped like `param`) the `.grad` of `param`, so that backward accumulates into
/// it in place (a view into a flat gradient buffer).
pub fn set_grad(param: &Tensor, grad: &Tensor) -> Result<()> {
    // SAFETY: tch's tensor pointers are `at::Tensor*`, live for this call.
    check(
        unsafe {
            ffi::dflash_set_grad(param.as_ptr() as *mut c_void, grad.as_ptr() as *mut c_void)
        },
        "setting a parameter's gradient buffer",
    )
}

/// The tensors of one fused AdamW step (see `fused_adamw`).
pub struct AdamWState<'a> {
    pub param: &'a Tensor,
    pub grad: &'a Tensor,
    pub m: &'a Tensor,
    pub v: &'a Tensor,
    /// f32 scalar: the step count after this step.
    pub step: &'a Tensor,
}

/// The hyper-parameters of one AdamW step.
pub struct AdamWHyper {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub weight_decay: f64,
    pub eps: f64,
}

/// One AdamW step through libtorch's fused CUDA kernel: grads divided by `grad_scale` when
/// given, nothing changed where `found_inf` (f32 scalar) is non-zero.
pub fn fused_adamw(
    s: &AdamWState,
    h: &AdamWHyper,
    grad_scale: Option<&Tensor>,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let opt = |t: Option<&Tensor>| t.map_or(std::ptr::null_mut(), p);
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call.
    check(
        unsafe {
            ffi::dflash_fused_adamw(
                p(s.param),
                p(s.grad),
                p(s.m),
                p(s.v),
                p(s.step),
                h.lr,
                h.beta1,
                h.beta2,
                h.weight_decay,
                h.eps,
                opt(grad_scale),
                opt(found_inf),
            )
        },
        "fused AdamW",
    )
}

/// One AdamW step over f32 masters whose weights the model reads in bf16: `master` f32; `m` and
/// `v` both f32, or both bf16 (rounded stochastically, keyed by `step`:
/// src/engine/train/optim/moments.rs); `grad` and `work` bf16, all of one length, contiguous, on
/// one GPU. `work` receives the updated masters rounded to bf16. The arithmetic is
/// `fused_adamw`'s, the bias corrections from `step` (the step count after this step);
/// `grad_scale` and `found_inf` as there.
pub fn adamw_bf16(
    (master, grad): (&Tensor, &Tensor),
    (m, v): (&Tensor, &Tensor),
    work: &Tensor,
    (h, step): (&AdamWHyper, f64),
    grad_scale: Option<&Tensor>,
    found_inf: Option<&Tensor>,
) -> Result<()> {
    let hyper = [
        h.lr,
        h.beta1,
        h.beta2,
        h.weight_decay,
        h.eps,
        1.0 - h.beta1.powf(step),
        (1.0 - h.beta2.powf(step)).sqrt(),
        step,
    ];
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let opt = |t: Option<&Tensor>| t.map_or(std::ptr::null_mut(), p);
    // SAFETY: live tensors (`at::Tensor*`) and a live array for the duration of the call; the
    // shim checks kinds, lengths and devices.
    check(
        unsafe {
            ffi::dflash_adamw_bf16(
                p(master),
                p(grad),
                p(m),
                p(v),
                p(work),
                &hyper,
                opt(grad_scale),
                opt(found_inf),
            )
        },
        "AdamW over bf16 weights",
    )
}
