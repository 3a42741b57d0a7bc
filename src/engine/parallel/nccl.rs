//! The NCCL path of drafter data parallel: libtorch's own `ProcessGroupNCCL`, reached through a
//! small C++ shim (src/engine/cxx/nccl_shim.cpp, built when the wheel's NCCL and CUDA headers are
//! there). One rank per drafter thread; the ranks meet through an in-process store. Replica 0's
//! weights are broadcast to all at start; the gradients are all-reduced in buckets while backward
//! runs (one bucket per drafter layer, last layer first), on NCCL's own stream, and the worker's
//! stream waits only for what was not done when backward ended (the buckets and the reducer:
//! src/engine/parallel/nccl/buckets.rs).

use super::shim::{checked, made};
use crate::engine::train::grad_mean::GradMean;
use crate::engine::train::optim::AdamW;
use anyhow::{anyhow, bail, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use tch::Tensor;

mod buckets;
use buckets::during_backward;
pub use buckets::{plan_buckets, Bucket};

/// Whether this build carries the shim.
pub const AVAILABLE: bool = cfg!(nccl_shim);

#[cfg(nccl_shim)]
mod ffi {
    use super::*;
    extern "C" {
        pub fn dflash_store_new() -> *mut c_void;
        pub fn dflash_store_free(store: *mut c_void);
        pub fn dflash_nccl_new(
            store: *mut c_void,
            rank: c_int,
            size: c_int,
            err: *mut c_char,
            len: usize,
        ) -> *mut c_void;
        pub fn dflash_nccl_free(pg: *mut c_void);
        pub fn dflash_nccl_abort(pg: *mut c_void) -> c_int;
        pub fn dflash_nccl_allreduce_mean(
            pg: *mut c_void,
            t: *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn dflash_nccl_broadcast(
            pg: *mut c_void,
            t: *mut c_void,
            root: c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        #[allow(clippy::too_many_arguments)]
        pub fn dflash_reducer_new(
            pg: *mut c_void,
            params: *const *mut c_void,
            n: c_int,
            flat: *mut c_void,
            param_bucket: *const c_int,
            buckets: c_int,
            span_bucket: *const c_int,
            span_off: *const i64,
            span_len: *const i64,
            spans: c_int,
            err: *mut c_char,
            len: usize,
        ) -> *mut c_void;
        pub fn dflash_reducer_finish(r: *mut c_void, err: *mut c_char, len: usize) -> c_int;
        pub fn dflash_reducer_free(r: *mut c_void);
    }
}

#[cfg(not(nccl_shim))]
mod ffi {
    use super::*;
    pub unsafe fn dflash_store_new() -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn dflash_store_free(_: *mut c_void) {}
    pub unsafe fn dflash_nccl_new(
        _: *mut c_void,
        _: c_int,
        _: c_int,
        _: *mut c_char,
        _: usize,
    ) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn dflash_nccl_free(_: *mut c_void) {}
    pub unsafe fn dflash_nccl_abort(_: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn dflash_nccl_allreduce_mean(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_nccl_broadcast(
        _: *mut c_void,
        _: *mut c_void,
        _: c_int,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dflash_reducer_new(
        _: *mut c_void,
        _: *const *mut c_void,
        _: c_int,
        _: *mut c_void,
        _: *const c_int,
        _: c_int,
        _: *const c_int,
        _: *const i64,
        _: *const i64,
        _: c_int,
        _: *mut c_char,
        _: usize,
    ) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn dflash_reducer_finish(_: *mut c_void, _: *mut c_char, _: usize) -> c_int {
        1
    }
    pub unsafe fn dflash_reducer_free(_: *mut c_void) {}
}

/// Where the ranks meet: an in-process HashStore of ours, or a job's TCPStore, kept alive by
/// its owner.
enum Store {
    Own(*mut c_void),
    Job(Arc<super::c10d::JobStore>),
}

impl Store {
    fn ptr(&self) -> *mut c_void {
        match self {
            Store::Own(p) => *p,
            Store::Job(s) => s.raw(),
        }
    }
}

// SAFETY: both stores are c10d stores, which are thread-safe; we only pass the pointer around.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        if let Store::Own(p) = self {
            // SAFETY: made by dflash_store_new, freed once.
            unsafe { ffi::dflash_store_free(*p) }
        }
    }
}

/// The process groups of the ranks made so far (addresses), so that any rank can abort them all.
type Registry = Arc<std::sync::Mutex<Vec<usize>>>;

/// The group of `size` ranks in this process.
pub struct NcclGroup {
    store: Arc<Store>,
    size: usize,
    made: Registry,
}

impl NcclGroup {
    pub fn new(size: usize) -> Result<NcclGroup> {
        if !AVAILABLE {
            bail!("this build has no NCCL shim (the wheel's NCCL/CUDA headers were missing at build time)");
        }
        // SAFETY: no preconditions.
        let store = unsafe { ffi::dflash_store_new() };
        Ok(NcclGroup {
            store: Arc::new(Store::Own(store)),
            size,
            made: Registry::default(),
        })
    }

    /// The group of a job's `size` replicas, meeting in the job's store (each replica makes its
    /// own member, with its index in the job, over a store connection of its own). The replicas
    /// of one process share the list of what to abort: one that fails frees its siblings too.
    pub fn over(store: Arc<super::c10d::JobStore>, size: usize) -> Result<NcclGroup> {
        if !AVAILABLE {
            bail!("this build has no NCCL shim (the wheel's NCCL/CUDA headers were missing at build time)");
        }
        static JOB_GROUPS: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
        Ok(NcclGroup {
            store: Arc::new(Store::Job(store)),
            size,
            made: JOB_GROUPS.get_or_init(Registry::default).clone(),
        })
    }

    /// Rank `rank`'s handle; its process group is made on first use, on the rank's own thread.
    pub fn member(&self, rank: usize) -> NcclMember {
        NcclMember {
            store: self.store.clone(),
            rank,
            size: self.size,
            pg: std::ptr::null_mut(),
            reducer: std::ptr::null_mut(),
            made: self.made.clone(),
        }
    }
}

pub struct NcclMember {
    store: Arc<Store>,
    rank: usize,
    size: usize,
    pg: *mut c_void,
    /// The buckets reduced during backward (null: one all-reduce after backward).
    reducer: *mut c_void,
    made: Registry,
}

// SAFETY: a member is used by the one drafter thread it is handed to.
unsafe impl Send for NcclMember {}

impl NcclMember {
    /// The rank's process group, made on first use on the calling thread.
    fn group(&mut self) -> Result<*mut c_void> {
        if self.pg.is_null() {
            let (store, rank, size) = (self.store.ptr(), self.rank as c_int, self.size as c_int);
            // SAFETY: the store outlives the member (Arc); e is a writable buffer of l bytes.
            self.pg = made(|e, l| unsafe { ffi::dflash_nccl_new(store, rank, size, e, l) })
                .map_err(|e| anyhow!("NCCL process group for rank {}: {e}", self.rank))?;
            self.made
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self.pg as usize);
        }
        Ok(self.pg)
    }

    /// One collective of the shim on `t`: `call(pg, tensor, err, len)` returns non-zero on error.
    fn collective(
        &mut self,
        what: &str,
        t: &mut Tensor,
        call: impl FnOnce(*mut c_void, *mut c_void, *mut c_char, usize) -> c_int,
    ) -> Result<()> {
        let pg = self.group()?;
        let t = t.as_mut_ptr() as *mut c_void;
        checked(|e, l| call(pg, t, e, l))
            .map_err(|e| anyhow!("NCCL {what} on rank {}: {e}", self.rank))
    }
}

impl GradMean for NcclMember {
    /// Every replica starts from replica 0's weights (broadcast), whatever it was built with.
    fn prepare(&mut self, optimizer: &mut AdamW) -> Result<()> {
        // SAFETY (closure): pg and tensor are live for the call.
        optimizer.change_flat_params(|flat| {
            self.collective(
                "broadcast of replica 0's weights",
                flat,
                |pg, t, e, l| unsafe { ffi::dflash_nccl_broadcast(pg, t, 0, e, l) },
            )
        })?;
        if during_backward() {
            self.hook_buckets(optimizer)?;
        }
        Ok(())
    }

    fn mean(&mut self, optimizer: &mut AdamW) -> Result<()> {
        if !self.reducer.is_null() {
            let reducer = self.reducer;
            // SAFETY: the reducer is live; e is a writable buffer of l bytes.
            return checked(|e, l| unsafe { ffi::dflash_reducer_finish(reducer, e, l) })
                .map_err(|e| anyhow!("NCCL gradient all-reduce on rank {}: {e}", self.rank));
        }
        // SAFETY (closure): pg and tensor are live for the call.
        self.collective(
            "all-reduce",
            optimizer.gathered_grads(),
            |pg, t, e, l| unsafe { ffi::dflash_nccl_allreduce_mean(pg, t, e, l) },
        )
    }

    fn world(&self) -> usize {
        self.size
    }

    /// Aborts every rank's communicators: the others' collectives end instead of waiting
    /// forever for this rank, which failed.
    fn abort(&mut self) {
        let made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        for &pg in made.iter() {
            // SAFETY: a live process group: a member takes its own out of the registry, under
            // this lock, before freeing it.
            unsafe { ffi::dflash_nccl_abort(pg as *mut c_void) };
        }
    }

    /// Always, also at world size 1 (the forced one-GPU check of this path).
    fn syncs(&self) -> bool {
        true
    }
}

impl Drop for NcclMember {
    fn drop(&mut self) {
        if !self.reducer.is_null() {
            // SAFETY: made by dflash_reducer_new, freed once (before its process group).
            unsafe { ffi::dflash_reducer_free(self.reducer) }
        }
        if !self.pg.is_null() {
            // Out of the registry first (under its lock), so no other rank aborts it once freed.
            self.made
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|&pg| pg != self.pg as usize);
            // SAFETY: made by dflash_nccl_new, freed once.
            unsafe { ffi::dflash_nccl_free(self.pg) }
        }
    }
}

#[cfg(test)]
mod tests;
