//! The CUDA shim (src/engine/cxx/cuda_shim.cpp, C++ over libtorch's CUDA API that build.rs
//! compiles against the wheel's headers): its C functions, where the build has it, or stand-ins
//! that say it is missing; and the device queries the probes and the engine both use (PCI bus
//! ids, memory). The engine's streams, events, graphs and kernels (src/engine/gpu/cuda.rs) call
//! through here.

use anyhow::{bail, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Whether this build carries the shim.
pub const AVAILABLE: bool = cfg!(cuda_shim);

#[cfg(cuda_shim)]
pub(crate) mod ffi {
    use super::*;
    extern "C" {
        pub fn dflash_cuda_last_error() -> *const c_char;
        pub fn dflash_kernels_start() -> c_int;
        pub fn dflash_kernels_stop(
            each: extern "C" fn(*mut c_void, *const c_char, u64),
            ctx: *mut c_void,
        ) -> c_int;
        pub fn dflash_stream_from_pool(device: c_int, out: *mut *mut c_void) -> c_int;
        pub fn dflash_stream_current(device: c_int, out: *mut *mut c_void) -> c_int;
        pub fn dflash_stream_free(s: *mut c_void);
        pub fn dflash_stream_set_current(s: *mut c_void) -> c_int;
        pub fn dflash_stream_synchronize(s: *mut c_void) -> c_int;
        pub fn dflash_stream_query(s: *mut c_void, done: *mut c_int) -> c_int;
        pub fn dflash_event_new(timing: c_int, out: *mut *mut c_void) -> c_int;
        pub fn dflash_event_free(e: *mut c_void);
        pub fn dflash_event_record(e: *mut c_void, s: *mut c_void) -> c_int;
        pub fn dflash_event_query(e: *mut c_void, done: *mut c_int) -> c_int;
        pub fn dflash_event_elapsed_ms(a: *mut c_void, b: *mut c_void, ms: *mut f64) -> c_int;
        pub fn dflash_stream_wait_event(s: *mut c_void, e: *mut c_void) -> c_int;
        pub fn dflash_tensor_record_stream(t: *mut c_void, s: *mut c_void) -> c_int;
        pub fn dflash_set_grad(param: *mut c_void, grad: *mut c_void) -> c_int;
        pub fn dflash_pin_memory(tensor: *mut c_void, out: *mut *mut c_void) -> c_int;
        pub fn dflash_device_pci(
            device: c_int,
            bus_id: *mut c_char,
            len: usize,
            uuid: *mut u8,
        ) -> c_int;
        pub fn dflash_flash_varlen(
            q: *mut c_void,
            k: *mut c_void,
            v: *mut c_void,
            cu_seqlens: *mut c_void,
            max_len: i64,
            window: i64,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_memory_peak(device: c_int, reset: c_int, peak: *mut u64) -> c_int;
        pub fn dflash_memory_total(device: c_int, total: *mut u64) -> c_int;
        pub fn dflash_compute_capability(
            device: c_int,
            major: *mut c_int,
            minor: *mut c_int,
        ) -> c_int;
        pub fn dflash_empty_cache() -> c_int;
        pub fn dflash_allocator_stats(device: c_int, out: *mut i64) -> c_int;
        pub fn dflash_fused_adamw(
            param: *mut c_void,
            grad: *mut c_void,
            m: *mut c_void,
            v: *mut c_void,
            step: *mut c_void,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            grad_scale: *mut c_void,
            found_inf: *mut c_void,
        ) -> c_int;
        /// `hyper`: lr, beta1, beta2, weight decay, eps, bias correction 1, sqrt of bias
        /// correction 2, the step count (the noise keys of bf16 moments).
        pub fn dflash_adamw_bf16(
            master: *mut c_void,
            grad: *mut c_void,
            m: *mut c_void,
            v: *mut c_void,
            work: *mut c_void,
            hyper: *const [f64; 8],
            grad_scale: *mut c_void,
            found_inf: *mut c_void,
        ) -> c_int;
        pub fn dflash_norm_rope(
            x: *mut c_void,
            col0: i64,
            heads: i64,
            w: *mut c_void,
            cos: *mut c_void,
            sin: *mut c_void,
            out: *mut c_void,
            eps: f64,
        ) -> c_int;
        pub fn dflash_silu_mul(g: *mut c_void, u: *mut c_void, out: *mut c_void) -> c_int;
        pub fn dflash_loss_rows(
            logits: *mut c_void,
            labels: *mut c_void,
            nll: *mut c_void,
            hit: *mut c_void,
        ) -> c_int;
        pub fn dflash_silu_mul_trained(
            g: *mut c_void,
            u: *mut c_void,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_norm_rope_trained(
            x: *mut c_void,
            w: *mut c_void,
            cos: *mut c_void,
            sin: *mut c_void,
            eps: f64,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_add_rms_norm_trained(
            x: *mut c_void,
            d: *mut c_void,
            w: *mut c_void,
            eps: f64,
            sum: *mut *mut c_void,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_project_into(
            x: *mut c_void,
            ws: *mut *mut c_void,
            grads: *mut *mut c_void,
            n: c_int,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_block_attention(
            q: *mut c_void,
            k: *mut c_void,
            v: *mut c_void,
            spans: *mut c_void,
            docs: *mut c_void,
            out: *mut *mut c_void,
        ) -> c_int;
        pub fn dflash_add_rms_norm(
            x: *mut c_void,
            d: *mut c_void,
            w: *mut c_void,
            sum: *mut c_void,
            out: *mut c_void,
            eps: f64,
        ) -> c_int;
        pub fn dflash_quantize_rows_e4m3(
            x: *mut c_void,
            q: *mut c_void,
            scale: *mut c_void,
            min_amax: f64,
            max_e4m3: f64,
        ) -> c_int;
        pub fn dflash_graph_new(out: *mut *mut c_void) -> c_int;
        pub fn dflash_graph_free(g: *mut c_void);
        pub fn dflash_graph_capture_begin(
            g: *mut c_void,
            device: c_int,
            share: *mut c_void,
        ) -> c_int;
        pub fn dflash_graph_capture_end(g: *mut c_void, device: c_int) -> c_int;
        pub fn dflash_graph_replay(g: *mut c_void, device: c_int) -> c_int;
    }
}

#[cfg(not(cuda_shim))]
#[allow(clippy::missing_safety_doc)]
pub(crate) mod ffi {
    use super::*;
    const NOT_BUILT: &CStr = c"this build has no CUDA shim (the wheel's CUDA headers were missing)";
    pub unsafe fn dflash_cuda_last_error() -> *const c_char {
        NOT_BUILT.as_ptr()
    }
    pub unsafe fn dflash_stream_from_pool(_: c_int, _: *mut *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_stream_current(_: c_int, _: *mut *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_set_grad(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_pin_memory(_: *mut c_void, _: *mut *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_stream_free(_: *mut c_void) {}
    pub unsafe fn dflash_stream_set_current(_: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_stream_synchronize(_: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_stream_query(_: *mut c_void, _: *mut c_int) -> c_int {
        1
    }
    pub unsafe fn dflash_event_new(_: c_int, _: *mut *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_event_free(_: *mut c_void) {}
    pub unsafe fn dflash_event_record(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_event_query(_: *mut c_void, _: *mut c_int) -> c_int {
        1
    }
    pub unsafe fn dflash_event_elapsed_ms(_: *mut c_void, _: *mut c_void, _: *mut f64) -> c_int {
        1
    }
    pub unsafe fn dflash_stream_wait_event(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_tensor_record_stream(_: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_flash_varlen(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: i64,
        _: i64,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_memory_peak(_: c_int, _: c_int, _: *mut u64) -> c_int {
        1
    }
    pub unsafe fn dflash_memory_total(_: c_int, _: *mut u64) -> c_int {
        1
    }
    pub unsafe fn dflash_compute_capability(_: c_int, _: *mut c_int, _: *mut c_int) -> c_int {
        1
    }
    pub unsafe fn dflash_empty_cache() -> c_int {
        1
    }
    pub unsafe fn dflash_allocator_stats(_: c_int, _: *mut i64) -> c_int {
        1
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dflash_fused_adamw(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
        _: f64,
        _: f64,
        _: f64,
        _: f64,
        _: *mut c_void,
        _: *mut c_void,
    ) -> c_int {
        1
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dflash_adamw_bf16(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *const [f64; 8],
        _: *mut c_void,
        _: *mut c_void,
    ) -> c_int {
        1
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dflash_norm_rope(
        _: *mut c_void,
        _: i64,
        _: i64,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_silu_mul(_: *mut c_void, _: *mut c_void, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_loss_rows(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_silu_mul_trained(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_norm_rope_trained(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_add_rms_norm_trained(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
        _: *mut *mut c_void,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_project_into(
        _: *mut c_void,
        _: *mut *mut c_void,
        _: *mut *mut c_void,
        _: c_int,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_block_attention(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut *mut c_void,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_add_rms_norm(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_quantize_rows_e4m3(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        _: f64,
        _: f64,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_graph_new(_: *mut *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_graph_free(_: *mut c_void) {}
    pub unsafe fn dflash_graph_capture_begin(_: *mut c_void, _: c_int, _: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_graph_capture_end(_: *mut c_void, _: c_int) -> c_int {
        1
    }
    pub unsafe fn dflash_graph_replay(_: *mut c_void, _: c_int) -> c_int {
        1
    }
    pub unsafe fn dflash_device_pci(_: c_int, _: *mut c_char, _: usize, _: *mut u8) -> c_int {
        1
    }
}

/// Turns a shim status into a result carrying the shim's message.
pub(crate) fn check(status: c_int, what: &str) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: the shim returns a NUL-terminated string owned by the calling thread.
    let msg = unsafe { CStr::from_ptr(ffi::dflash_cuda_last_error()) };
    bail!("{what}: {}", msg.to_string_lossy())
}

/// The PCI bus id (NVML's form, "00000000:18:00.0") and UUID of CUDA device `device` as this
/// process numbers it (after `CUDA_VISIBLE_DEVICES`).
pub fn device_pci(device: usize) -> Result<(String, [u8; 16])> {
    let mut bus = [0 as c_char; 32];
    let mut uuid = [0u8; 16];
    // SAFETY: buffers of the sizes passed.
    check(
        unsafe {
            ffi::dflash_device_pci(
                device as c_int,
                bus.as_mut_ptr(),
                bus.len(),
                uuid.as_mut_ptr(),
            )
        },
        "CUDA device properties",
    )?;
    // SAFETY: snprintf NUL-terminates within the buffer.
    let bus = unsafe { CStr::from_ptr(bus.as_ptr()) };
    Ok((bus.to_string_lossy().into_owned(), uuid))
}

/// The most bytes libtorch's caching allocator has had allocated on CUDA device `device` since the
/// last reset (`reset` starts a new period after reading it).
pub fn memory_peak(device: usize, reset: bool) -> Result<u64> {
    let mut peak = 0;
    // SAFETY: valid out pointer.
    check(
        unsafe { ffi::dflash_memory_peak(device as c_int, reset as c_int, &mut peak) },
        "CUDA memory statistics",
    )?;
    Ok(peak)
}

/// The memory of CUDA device `device`, bytes.
pub fn memory_total(device: usize) -> Result<u64> {
    let mut total = 0;
    // SAFETY: valid out pointer.
    check(
        unsafe { ffi::dflash_memory_total(device as c_int, &mut total) },
        "CUDA device properties",
    )?;
    Ok(total)
}

/// The compute capability of CUDA device `device`, as (major, minor).
pub fn compute_capability(device: usize) -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out pointers.
    check(
        unsafe { ffi::dflash_compute_capability(device as c_int, &mut major, &mut minor) },
        "CUDA device properties",
    )?;
    Ok((major, minor))
}

/// Gives the caching allocator's unused cached blocks back to the device (libtorch's
/// `emptyCache`, as `torch.cuda.empty_cache()`).
pub fn empty_cache() -> Result<()> {
    // SAFETY: no arguments.
    check(
        unsafe { ffi::dflash_empty_cache() },
        "emptying the CUDA cache",
    )
}

/// libtorch's caching allocator on one CUDA device (`getDeviceStats`): what it holds now, and
/// its counts since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes reserved from the device (cached, used or not).
    pub reserved_bytes: u64,
    /// Bytes in tensors now.
    pub allocated_bytes: u64,
    /// Segments (device allocations) held now.
    pub segments: u64,
    /// Device allocations made (cudaMalloc, or mapped with expandable segments), in all.
    pub device_allocs: u64,
    /// Device frees made (cudaFree, or unmapped), in all.
    pub device_frees: u64,
    /// Failed device allocations that freed the cache and retried, in all.
    pub alloc_retries: u64,
    /// CUDA graph captures this process began and ended on the device, in all: a capture
    /// takes its graph's memory pool from the device as it runs (device allocations that are no
    /// churn).
    pub graph_events: u64,
}

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// CUDA graph captures begun and ended, per device (`capture_began`, `capture_ended`).
static GRAPH_EVENTS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
/// CUDA graph captures under way, per device.
static CAPTURING: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];

/// Counts a CUDA graph capture begun on `device` (the allocator's statistics carry the count).
pub fn capture_began(device: usize) {
    if let (Some(n), Some(c)) = (GRAPH_EVENTS.get(device), CAPTURING.get(device)) {
        c.fetch_add(1, Relaxed);
        n.fetch_add(1, Relaxed);
    }
}

/// Counts a CUDA graph capture ended on `device`, whether it succeeded or not.
pub fn capture_ended(device: usize) {
    if let (Some(n), Some(c)) = (GRAPH_EVENTS.get(device), CAPTURING.get(device)) {
        n.fetch_add(1, Relaxed);
        let _ = c.fetch_update(Relaxed, Relaxed, |k| k.checked_sub(1));
    }
}

/// Whether a CUDA graph capture is under way on `device` (in this process).
pub fn capturing(device: usize) -> bool {
    CAPTURING.get(device).is_some_and(|c| c.load(Relaxed) > 0)
}

fn graph_events(device: usize) -> u64 {
    GRAPH_EVENTS.get(device).map_or(0, |n| n.load(Relaxed))
}

/// The caching allocator's statistics on CUDA device `device`; an error without the shim, or
/// before this process allocated there.
pub fn allocator_stats(device: usize) -> Result<AllocatorStats> {
    let mut out = [0i64; 6];
    // SAFETY: the shim writes six values into `out`.
    check(
        unsafe { ffi::dflash_allocator_stats(device as c_int, out.as_mut_ptr()) },
        "CUDA allocator statistics",
    )?;
    let n = |i: usize| out[i].max(0) as u64;
    Ok(AllocatorStats {
        reserved_bytes: n(0),
        allocated_bytes: n(1),
        segments: n(2),
        device_allocs: n(3),
        device_frees: n(4),
        alloc_retries: n(5),
        graph_events: graph_events(device),
    })
}
