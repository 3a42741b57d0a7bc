//! The FP8 target's kernel of our own (src/engine/cxx/target_kernels.cpp, a program of its own
//! compiled at run time with NVRTC): a bf16 matrix's rows in e4m3, each with its scale, in one
//! pass over the row (libtorch's ops take six: abs, amax, a cast, a division, a clamp and the
//! cast to e4m3). A row holding a NaN differs: the kernel's max passes it over, libtorch's amax
//! keeps it (a NaN scale); the NaN itself comes out a NaN either way. `None` where it cannot
//! run, and the caller runs the ops (src/engine/model/fp8.rs).

use super::{check, ffi, AVAILABLE};
use crate::engine::gpu::fast_paths::PathState;
use std::ffi::c_void;
use tch::{Kind, Tensor};

/// Whether the kernel ran in this process (the ops from the first failure on).
static STATE: PathState = PathState::untried();

/// "kernel" once it ran, "ops (failed: ...)" after it failed, else "ops".
pub fn fp8_kernel_state() -> String {
    STATE.describe("kernel", "ops")
}

/// Each row of `x` (bf16 on CUDA, [rows, cols], cols a multiple of 8) in e4m3, over its scale
/// (f32 [rows, 1]): `max(amax, min_amax) / max_e4m3`, rounded to nearest even and saturated.
/// `None` where the kernel cannot run (no shim, another dtype or device, an odd width, the
/// target kernels turned off, or an earlier failure).
pub fn quantize_rows_e4m3(x: &Tensor, min_amax: f64, max_e4m3: f64) -> Option<(Tensor, Tensor)> {
    use crate::engine::gpu::fast_paths::{on, FastPath};
    let size = x.size();
    let fits = size.len() == 2 && size[1] > 0 && size[1] % 8 == 0;
    let ready = on(FastPath::TargetKernels) && AVAILABLE && !STATE.has_failed();
    if !fits || !ready || x.kind() != Kind::BFloat16 || !x.device().is_cuda() {
        return None;
    }
    let x = x.contiguous();
    let q = Tensor::empty(&size, (Kind::Float8e4m3fn, x.device()));
    let scale = Tensor::empty([size[0], 1], (Kind::Float, x.device()));
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes.
    let status =
        unsafe { ffi::dflash_quantize_rows_e4m3(p(&x), p(&q), p(&scale), min_amax, max_e4m3) };
    STATE
        .took(check(status, "the e4m3 row quantization kernel"))
        .then_some((q, scale))
}
