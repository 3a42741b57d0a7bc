//! The drafter's block attention in kernels of our own (src/engine/cxx/attention_kernels.cpp,
//! compiled at run time with NVRTC): each block's 16 queries against the context keys of its
//! span and its own 16 keys, nothing else computed, forward and backward as one autograd op.
//! Returns `None` where it cannot run, and the caller takes the tiled sdpa path.

use super::{adopt, ffi, AVAILABLE};
use crate::engine::gpu::fast_paths::PathState;
use std::ffi::c_void;
use tch::{Kind, Tensor};

/// Whether the block attention kernels ran in this process (tiled sdpa from a failure on).
static STATE: PathState = PathState::untried();

/// "kernel" once the kernels ran, "tiled (failed: ...)" after one failed, else "tiled".
pub fn block_attention_state() -> String {
    STATE.describe("kernel", "tiled")
}

/// Whether the kernels take these shapes: bf16 on CUDA, heads of 128, a whole number of query
/// heads a KV head (4 at Qwen3-8B's shapes, 5 at 14B's, 8 at 32B's), 16 queries a block; the
/// shim built, none failed before, and not turned off (`--disable block-attention`).
fn usable(q: &Tensor, k: &Tensor) -> bool {
    use crate::engine::gpu::fast_paths::{on, FastPath};
    let (qs, ks) = (q.size(), k.size());
    let shapes = qs.len() == 4
        && ks.len() == 4
        && qs[3] == 128
        && ks[3] == 128
        && qs[1] % 16 == 0
        && ks[2] > 0
        && qs[2] % ks[2] == 0;
    shapes
        && on(FastPath::BlockAttention)
        && AVAILABLE
        && !STATE.has_failed()
        && q.kind() == Kind::BFloat16
        && q.device().is_cuda()
}

/// The attention of each block's queries over the keys it sees: `q` [b, 16a, hq, 128], `k` and
/// `v` [b, s + 16a, hkv, 128] (the context's keys, then the blocks' own), bf16 on one GPU;
/// `spans` [b, a, 4] int32 and `docs` [b, s] int32 as `blocks::block_spans` makes them. Gives
/// [b, 16a, hq, 128], differentiable in q, k and v; `None` where the kernels cannot run.
pub fn block_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    spans: &Tensor,
    docs: &Tensor,
) -> Option<Tensor> {
    if !usable(q, k) {
        return None;
    }
    let (q, k, v) = (q.contiguous(), k.contiguous(), v.contiguous());
    let p = |t: &Tensor| t.as_ptr() as *mut c_void;
    let mut out = std::ptr::null_mut();
    // SAFETY: live tensors (`at::Tensor*`) for the duration of the call; the shim checks shapes
    // and, on success, hands over a heap-allocated `at::Tensor` that `from_ptr` takes.
    let status =
        unsafe { ffi::dflash_block_attention(p(&q), p(&k), p(&v), p(spans), p(docs), &mut out) };
    adopt(&STATE, status, out, "the block attention kernels")
}
