//! CUDA streams and events through the C++ shim (src/engine/cxx/cuda_shim.cpp), which build.rs
//! compiles against the wheel's headers: a stream from libtorch's pool per worker, events at phase
//! marks, and the cross-stream hand-off. Where the shim is not built, every call says so.
//!
//! The shim's other calls live in rooms of their own: CUDA graphs (`graph`), our kernels for the
//! target (`target_kernels`, and its FP8 rows: `fp8_kernels`) and the drafter
//! (`drafter_kernels`), weight gradients accumulated in their GEMMs (`gemm_grads`), varlen flash
//! attention
//! (`flash_attention`), and the optimizer's flat gradients and fused AdamW (`optimizer`).

use crate::cuda_shim::AVAILABLE;
use crate::cuda_shim::{check, ffi};
use anyhow::Result;
use std::ffi::{c_int, c_void};
use tch::Tensor;

mod block_attention;
mod drafter_kernels;
mod flash_attention;
mod fp8_kernels;
mod gemm_grads;
mod graph;
mod optimizer;
mod target_kernels;
pub use block_attention::{block_attention, block_attention_state};
pub use drafter_kernels::{
    add_rms_norm_trained, drafter_kernels_state, loss_rows, norm_rope_trained, silu_mul_trained,
};
pub use flash_attention::flash_varlen;
pub use fp8_kernels::{fp8_kernel_state, quantize_rows_e4m3};
pub use gemm_grads::{gemm_grads_state, project_into, with_gemm_grads};
pub use graph::{graphs_wanted, Graph};
pub use optimizer::{adamw_bf16, fused_adamw, set_grad, AdamWHyper, AdamWState};
pub use target_kernels::{add_rms_norm, norm_rope, silu_mul, target_kernels_state};

/// The tensor a shim call of `state`'s path handed over in `out` (a heap-allocated
/// `at::Tensor`), or `None` where the call failed (noted in `state`: `PathState::took`).
fn adopt(
    state: &crate::engine::gpu::fast_paths::PathState,
    status: c_int,
    out: *mut c_void,
    what: &str,
) -> Option<Tensor> {
    // SAFETY: on success the shim handed over a heap-allocated `at::Tensor`, which `from_ptr`
    // takes.
    state
        .took(check(status, what))
        .then(|| unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

/// Whether our kernels (the target's and AdamW's for bf16 weights, compiled at run time with
/// NVRTC) compile and run on `device`: each run once on a few zeros. Where they cannot, the
/// engine runs libtorch's ops instead, slower; `doctor` says which.
pub fn runtime_kernels_check(device: tch::Device) -> Result<()> {
    if !AVAILABLE || !device.is_cuda() {
        anyhow::bail!("no CUDA shim in this build, or not a GPU");
    }
    let half = Tensor::zeros([8], (tch::Kind::BFloat16, device));
    let out = half.empty_like();
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    // SAFETY: live tensors (`at::Tensor*`) for the call; the shim checks them.
    check(
        unsafe { ffi::dflash_silu_mul(p(&half), p(&half), p(&out)) },
        "the target's kernels",
    )?;
    let float = Tensor::zeros([8], (tch::Kind::Float, device));
    let (m, v) = (float.copy(), float.copy());
    let hyper = AdamWHyper {
        lr: 0.0,
        beta1: 0.9,
        beta2: 0.999,
        weight_decay: 0.0,
        eps: 1e-8,
    };
    adamw_bf16((&float, &half), (&m, &v), &out, (&hyper, 1.0), None, None)
}

/// A host tensor on `device` without the host waiting for the device. A plain copy from pageable
/// host memory synchronises the current stream first (libtorch's blocking copy), which in the
/// middle of a step stalls the host until everything queued so far has run; staged in pinned
/// memory, the copy is queued on the stream like a kernel (the pinned block is kept until the
/// copy has run). Anything else is a plain `to_device`.
pub fn upload(t: &Tensor, device: tch::Device) -> Tensor {
    if AVAILABLE && t.device() == tch::Device::Cpu && device.is_cuda() {
        if let Ok(pinned) = pin_memory(t) {
            return pinned.to_device_(device, t.kind(), true, false);
        }
    }
    t.to_device(device)
}

/// A pinned host copy of `t` (through the shim: tch's `pin_memory` passes a device argument,
/// which libtorch warns about as deprecated).
fn pin_memory(t: &Tensor) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    // SAFETY: tch's tensor pointer is an `at::Tensor*` live for the call; on success the shim
    // hands over a heap-allocated `at::Tensor`, which `from_ptr` takes ownership of.
    check(
        unsafe { ffi::dflash_pin_memory(t.as_ptr() as *mut c_void, &mut out) },
        "pinning host memory",
    )?;
    // SAFETY: see above.
    Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

/// A CUDA stream handle (libtorch's `CUDAStream`).
pub struct Stream(*mut c_void);

// SAFETY: a stream handle is a plain value (device index + stream id); CUDA streams may be used
// from any thread.
unsafe impl Send for Stream {}

impl Stream {
    /// On a CUDA device (with the shim): a stream from libtorch's pool made the calling
    /// thread's current one, so its kernels run beside, not behind, another thread's on the same
    /// GPU. None elsewhere.
    pub fn own(device: tch::Device) -> Result<Option<Stream>> {
        match device {
            tch::Device::Cuda(i) if AVAILABLE => {
                let stream = Stream::from_pool(i)?;
                stream.make_current()?;
                Ok(Some(stream))
            }
            _ => Ok(None),
        }
    }

    /// A stream of its own from libtorch's pool on `device`.
    pub fn from_pool(device: usize) -> Result<Stream> {
        let mut out = std::ptr::null_mut();
        // SAFETY: `out` is a valid place for the handle.
        check(
            unsafe { ffi::dflash_stream_from_pool(device as c_int, &mut out) },
            "a CUDA stream from libtorch's pool",
        )?;
        Ok(Stream(out))
    }

    /// The calling thread's current stream on `device`.
    pub fn current(device: usize) -> Result<Stream> {
        let mut out = std::ptr::null_mut();
        // SAFETY: as above.
        check(
            unsafe { ffi::dflash_stream_current(device as c_int, &mut out) },
            "the current CUDA stream",
        )?;
        Ok(Stream(out))
    }

    /// Makes this the calling thread's current stream: its libtorch ops run on it from now on.
    pub fn make_current(&self) -> Result<()> {
        // SAFETY: `self.0` is a live handle.
        check(
            unsafe { ffi::dflash_stream_set_current(self.0) },
            "setting the current stream",
        )
    }

    /// Blocks the host until the work queued on this stream (only) has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `self.0` is a live handle.
        check(
            unsafe { ffi::dflash_stream_synchronize(self.0) },
            "stream synchronize",
        )
    }

    /// Whether every piece of work queued on this stream has finished.
    pub fn is_idle(&self) -> Result<bool> {
        let mut done = 0;
        // SAFETY: live handle, valid out pointer.
        check(
            unsafe { ffi::dflash_stream_query(self.0, &mut done) },
            "stream query",
        )?;
        Ok(done == 1)
    }

    /// Makes this stream wait, on the device, for the work before `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        // SAFETY: both handles are live.
        check(
            unsafe { ffi::dflash_stream_wait_event(self.0, event.0) },
            "stream wait on event",
        )
    }

    /// Tells the caching allocator that `t` is used on this stream.
    pub fn record_tensor(&self, t: &Tensor) -> Result<()> {
        if !t.device().is_cuda() {
            return Ok(());
        }
        // SAFETY: tch's tensor pointer is an `at::Tensor*`; the handle is live.
        check(
            unsafe { ffi::dflash_tensor_record_stream(t.as_ptr() as *mut c_void, self.0) },
            "record_stream",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { ffi::dflash_stream_free(self.0) }
    }
}

/// A CUDA event (libtorch's `c10::Event`); the CUDA event is created on its first record.
pub struct Event(*mut c_void);

// SAFETY: CUDA events may be recorded, queried and waited on from any thread.
unsafe impl Send for Event {}

impl Event {
    /// `timing`: whether elapsed times can be read between two such events.
    pub fn new(timing: bool) -> Result<Event> {
        let mut out = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check(
            unsafe { ffi::dflash_event_new(timing as c_int, &mut out) },
            "a CUDA event",
        )?;
        Ok(Event(out))
    }

    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live.
        check(
            unsafe { ffi::dflash_event_record(self.0, stream.0) },
            "event record",
        )
    }

    /// Whether the work before the event's last record has finished (never blocks).
    pub fn is_done(&self) -> Result<bool> {
        let mut done = 0;
        // SAFETY: live handle, valid out pointer.
        check(
            unsafe { ffi::dflash_event_query(self.0, &mut done) },
            "event query",
        )?;
        Ok(done == 1)
    }

    /// Device milliseconds from this event to `later` (both complete).
    pub fn ms_until(&self, later: &Event) -> Result<f64> {
        let mut ms = 0.0;
        // SAFETY: live handles, valid out pointer.
        check(
            unsafe { ffi::dflash_event_elapsed_ms(self.0, later.0, &mut ms) },
            "event elapsed time",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { ffi::dflash_event_free(self.0) }
    }
}

/// For the library's GPU tests: cuda:0 where there is a GPU and this build has the shim, else
/// `None` with a line saying that `what` was skipped.
#[cfg(test)]
pub(crate) fn cuda_or_skip(what: &str) -> Option<tch::Device> {
    if tch::Cuda::is_available() && AVAILABLE {
        Some(tch::Device::Cuda(0))
    } else {
        eprintln!("skipped: {what} needs a GPU and the CUDA shim");
        None
    }
}
