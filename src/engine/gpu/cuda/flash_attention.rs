//! Flash attention through the shim (libtorch's `_flash_attention_forward`): the target's
//! attention over packed documents as variable-length sequences (see `engine::varlen`).

use super::{check, ffi};
use anyhow::Result;
use std::ffi::c_void;
use tch::Tensor;

/// Causal flash attention over packed sequences (libtorch's `_flash_attention_forward`, varlen):
/// q [total, hq, d], k/v [total, hkv, d], `cu_seqlens` int32 [n + 1] on the same device, `window`
/// (sliding layers) the number of keys up to and including the query's own. -> [total, hq, d]
pub fn flash_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens: &Tensor,
    max_len: i64,
    window: Option<i64>,
) -> Result<Tensor> {
    let mut out = std::ptr::null_mut();
    // SAFETY: tch's tensor pointers are `at::Tensor*` and live for the call; on success the shim
    // hands over a heap-allocated `at::Tensor`, which `from_ptr` takes ownership of.
    check(
        unsafe {
            ffi::dflash_flash_varlen(
                q.as_ptr() as *mut c_void,
                k.as_ptr() as *mut c_void,
                v.as_ptr() as *mut c_void,
                cu_seqlens.as_ptr() as *mut c_void,
                max_len,
                window.unwrap_or(-1),
                &mut out,
            )
        },
        "flash attention",
    )?;
    // SAFETY: see above.
    Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}
