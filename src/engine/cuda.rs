//! CUDA streams and events through the C++ shim (src/engine/cxx/cuda_shim.cpp), which build.rs
//! compiles against the wheel's headers: a stream from libtorch's pool per worker, events at phase
//! marks, and the cross-stream hand-off. Where the shim is not built, every call says so.

use anyhow::{bail, Result};
use std::ffi::{c_char, c_int, c_void, CStr};
use tch::Tensor;

/// Whether this build carries the shim.
pub const AVAILABLE: bool = cfg!(cuda_shim);

#[cfg(cuda_shim)]
mod ffi {
    use super::*;
    extern "C" {
        pub fn dflash_cuda_last_error() -> *const c_char;
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
        pub fn dflash_device_pci(
            device: c_int,
            bus_id: *mut c_char,
            len: usize,
            uuid: *mut u8,
        ) -> c_int;
    }
}

#[cfg(not(cuda_shim))]
#[allow(clippy::missing_safety_doc)]
mod ffi {
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
    pub unsafe fn dflash_device_pci(_: c_int, _: *mut c_char, _: usize, _: *mut u8) -> c_int {
        1
    }
}

/// Turns a shim status into a result carrying the shim's message.
fn check(status: c_int, what: &str) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: the shim returns a NUL-terminated string owned by the calling thread.
    let msg = unsafe { CStr::from_ptr(ffi::dflash_cuda_last_error()) };
    bail!("{what}: {}", msg.to_string_lossy())
}

/// A CUDA stream handle (libtorch's `CUDAStream`).
pub struct Stream(*mut c_void);

// SAFETY: a stream handle is a plain value (device index + stream id); CUDA streams may be used
// from any thread.
unsafe impl Send for Stream {}

impl Stream {
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
