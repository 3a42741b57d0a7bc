//! CUDA graphs (libtorch's `at::cuda::CUDAGraph` through the shim): the work a thread queues on
//! its stream, recorded once and replayed with one launch.

use super::{check, ffi, AVAILABLE};
use anyhow::{bail, Result};
use std::ffi::{c_int, c_void};

/// Whether CUDA graphs may be used: on by default where the shim is built; `--disable graphs`
/// turns them all off (for side-by-side measurements).
pub fn graphs_wanted() -> bool {
    use crate::engine::gpu::fast_paths::{on, FastPath};
    AVAILABLE && on(FastPath::Graphs)
}

/// A CUDA graph: what the calling thread queues on its current stream between the start and the
/// end of `capture`, replayed with one launch.
pub struct Graph {
    handle: *mut c_void,
    /// The CUDA device it is captured on and replayed on.
    device: c_int,
}

// SAFETY: the graph is used by the thread that owns it; moving it between threads is fine.
unsafe impl Send for Graph {}

impl Graph {
    /// Records the work `f` queues on the calling thread's current stream of CUDA device
    /// `device` (which must not be the default stream). The tensors `f` returns live in the
    /// graph's memory pool, or in `share`'s when given (graphs that never replay at the same
    /// time, whose outputs are used before another replays): every replay writes them again.
    pub fn capture<T>(
        device: tch::Device,
        share: Option<&Graph>,
        f: impl FnOnce() -> T,
    ) -> Result<(Graph, T)> {
        let tch::Device::Cuda(device) = device else {
            bail!("CUDA graphs are captured on CUDA devices, not on {device:?}");
        };
        let mut out = std::ptr::null_mut();
        // SAFETY: valid out pointer.
        check(unsafe { ffi::dflash_graph_new(&mut out) }, "a CUDA graph")?;
        let graph = Graph {
            handle: out,
            device: device as c_int,
        };
        crate::cuda_shim::capture_began(device);
        // SAFETY: live handle.
        let began = check(
            unsafe {
                let share = share.map_or(std::ptr::null_mut(), |g| g.handle);
                ffi::dflash_graph_capture_begin(graph.handle, graph.device, share)
            },
            "CUDA graph capture",
        );
        if let Err(e) = began {
            crate::cuda_shim::capture_ended(device);
            return Err(e);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        // SAFETY: live handle; ends the capture whatever `f` did.
        let ended = check(
            unsafe { ffi::dflash_graph_capture_end(graph.handle, graph.device) },
            "CUDA graph capture",
        );
        crate::cuda_shim::capture_ended(device);
        match result {
            Ok(value) => ended.map(|_| (graph, value)),
            Err(_) => bail!("an operation failed while being captured into a CUDA graph"),
        }
    }

    pub fn replay(&self) -> Result<()> {
        // SAFETY: live handle.
        check(
            unsafe { ffi::dflash_graph_replay(self.handle, self.device) },
            "CUDA graph replay",
        )
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { ffi::dflash_graph_free(self.handle) }
    }
}
