//! Calling this room's C++ shims (src/engine/cxx/c10d_shim.cpp and nccl_shim.cpp): each call
//! gets an error buffer, and a failed call's message is the buffer's first line (libtorch
//! appends a C++ backtrace after it). One place for the job's store and Gloo group
//! (src/engine/parallel/c10d.rs) and NCCL's process groups and reducer
//! (src/engine/parallel/nccl.rs).

use std::ffi::{c_char, c_int, c_void};

/// Bytes a shim may write of its message.
const MESSAGE_BYTES: usize = 2048;

/// The message the shim wrote for a failed call: its first line.
fn shim_error(buf: &[u8]) -> String {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let text = String::from_utf8_lossy(&buf[..end]);
    text.lines().next().unwrap_or("").trim().to_string()
}

/// Calls a shim function that returns non-zero on failure (`call(err, len)`); its message then.
pub(super) fn checked(call: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
    let mut err = vec![0u8; MESSAGE_BYTES];
    match call(err.as_mut_ptr() as *mut c_char, err.len()) {
        0 => Ok(()),
        _ => Err(shim_error(&err)),
    }
}

/// Calls a shim function that makes an object (`call(err, len)`): its pointer, or its message
/// where it returned null.
pub(super) fn made(
    call: impl FnOnce(*mut c_char, usize) -> *mut c_void,
) -> Result<*mut c_void, String> {
    let mut ptr = std::ptr::null_mut();
    checked(|e, l| {
        ptr = call(e, l);
        ptr.is_null() as c_int
    })?;
    Ok(ptr)
}
