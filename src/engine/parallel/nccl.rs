//! The NCCL path of drafter data parallel: libtorch's own `ProcessGroupNCCL`, reached through a
//! small C++ shim (src/engine/cxx/nccl_shim.cpp, built when the wheel's NCCL and CUDA headers are
//! there). One rank per drafter thread; the ranks meet through an in-process store. Replica 0's
//! weights are broadcast to all at start; the gradients are all-reduced in buckets while backward
//! runs (one bucket per drafter layer, last layer first), on NCCL's own stream, and the worker's
//! stream waits only for what was not done when backward ended.

use crate::engine::train::grad_mean::GradMean;
use crate::engine::train::optim::AdamW;
use anyhow::{bail, Result};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;
use tch::Tensor;

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

/// Whether gradients are all-reduced during backward (the default) or in one piece after it
/// (`--disable grad-sync-during-backward`, for side-by-side measurements).
fn during_backward() -> bool {
    crate::engine::gpu::fast_paths::on(
        crate::engine::gpu::fast_paths::FastPath::GradSyncDuringBackward,
    )
}

/// A group of parameters whose gradients are all-reduced together: the parameters (indices in
/// the optimizer's order) and the contiguous spans of the flat gradient buffer they cover.
#[derive(Debug, PartialEq)]
pub struct Bucket {
    pub params: Vec<usize>,
    pub spans: Vec<(i64, i64)>,
}

/// The drafter's parameters grouped in the order backward finishes them: one bucket per decoder
/// layer, the last layer first, then everything outside the layers (the context projection and
/// its norm are the last gradients backward computes). `layout` is (name, (offset, numel)) in
/// the flat buffer's order.
pub fn plan_buckets(layout: &[(&str, (i64, i64))]) -> Vec<Bucket> {
    let layer_of = |name: &str| -> Option<usize> {
        name.strip_prefix("layers.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    };
    let layers = layout.iter().filter_map(|(n, _)| layer_of(n)).max();
    let order: Vec<Option<usize>> = match layers {
        Some(top) => (0..=top).rev().map(Some).chain([None]).collect(),
        None => vec![None],
    };
    order
        .into_iter()
        .filter_map(|key| {
            let mut bucket = Bucket {
                params: Vec::new(),
                spans: Vec::new(),
            };
            for (i, (name, (off, len))) in layout.iter().enumerate() {
                if layer_of(name) != key {
                    continue;
                }
                bucket.params.push(i);
                match bucket.spans.last_mut() {
                    Some((o, l)) if *o + *l == *off => *l += len,
                    _ => bucket.spans.push((*off, *len)),
                }
            }
            (!bucket.params.is_empty()).then_some(bucket)
        })
        .collect()
}

// SAFETY: a member is used by the one drafter thread it is handed to.
unsafe impl Send for NcclMember {}

use super::c10d::shim_error as error_text;

impl NcclMember {
    /// The rank's process group, made on first use on the calling thread.
    fn group(&mut self) -> Result<*mut c_void> {
        let mut err = vec![0u8; 1024];
        if self.pg.is_null() {
            // SAFETY: the store outlives the member (Arc); err is a writable buffer of its length.
            self.pg = unsafe {
                ffi::dflash_nccl_new(
                    self.store.ptr(),
                    self.rank as c_int,
                    self.size as c_int,
                    err.as_mut_ptr() as *mut c_char,
                    err.len(),
                )
            };
            if self.pg.is_null() {
                bail!(
                    "NCCL process group for rank {}: {}",
                    self.rank,
                    error_text(&err)
                );
            }
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
        let mut err = vec![0u8; 1024];
        let rc = call(
            pg,
            t.as_mut_ptr() as *mut c_void,
            err.as_mut_ptr() as *mut c_char,
            err.len(),
        );
        if rc != 0 {
            bail!("NCCL {what} on rank {}: {}", self.rank, error_text(&err));
        }
        Ok(())
    }

    /// Hooks the bucketed all-reduce into backward: the gradients move into one flat buffer
    /// (each parameter's `.grad` a view), and each bucket goes out when backward completes it.
    fn hook_buckets(&mut self, optimizer: &mut AdamW) -> Result<()> {
        let pg = self.group()?;
        let mut flat = optimizer.keep_grads_flat(crate::engine::gpu::cuda::set_grad)?;
        let layout: Vec<(&str, &Tensor, (i64, i64))> = optimizer.layout().collect();
        let names: Vec<(&str, (i64, i64))> = layout.iter().map(|(n, _, s)| (*n, *s)).collect();
        let buckets = plan_buckets(&names);
        let mut param_bucket = vec![0 as c_int; layout.len()];
        let (mut span_bucket, mut span_off, mut span_len) = (Vec::new(), Vec::new(), Vec::new());
        for (b, bucket) in buckets.iter().enumerate() {
            for &p in &bucket.params {
                param_bucket[p] = b as c_int;
            }
            for &(off, len) in &bucket.spans {
                span_bucket.push(b as c_int);
                span_off.push(off);
                span_len.push(len);
            }
        }
        let params: Vec<*mut c_void> = layout
            .iter()
            .map(|(_, t, _)| t.as_ptr() as *mut c_void)
            .collect();
        let mut err = vec![0u8; 1024];
        // SAFETY: every pointer is live for the call (tch's at::Tensor*, the vectors above); the
        // shim copies what it keeps (tensor handles, the bucket tables).
        let reducer = unsafe {
            ffi::dflash_reducer_new(
                pg,
                params.as_ptr(),
                params.len() as c_int,
                flat.as_mut_ptr() as *mut c_void,
                param_bucket.as_ptr(),
                buckets.len() as c_int,
                span_bucket.as_ptr(),
                span_off.as_ptr(),
                span_len.as_ptr(),
                span_bucket.len() as c_int,
                err.as_mut_ptr() as *mut c_char,
                err.len(),
            )
        };
        if reducer.is_null() {
            bail!(
                "NCCL gradient buckets on rank {}: {}",
                self.rank,
                error_text(&err)
            );
        }
        self.reducer = reducer;
        Ok(())
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
            let mut err = vec![0u8; 1024];
            // SAFETY: the reducer is live; err is a writable buffer of its length.
            let rc = unsafe {
                ffi::dflash_reducer_finish(self.reducer, err.as_mut_ptr() as *mut c_char, err.len())
            };
            if rc != 0 {
                bail!(
                    "NCCL gradient all-reduce on rank {}: {}",
                    self.rank,
                    error_text(&err)
                );
            }
            return Ok(());
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
