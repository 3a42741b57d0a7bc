//! The NCCL path of drafter data parallel: libtorch's own `ProcessGroupNCCL`, reached through a
//! small C++ shim (src/engine/cxx/nccl_shim.cpp, built when the wheel's NCCL and CUDA headers are
//! there). One rank per drafter thread; the ranks meet through an in-process store.

use super::replicas::GradMean;
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
        pub fn dflash_nccl_allreduce_mean(
            pg: *mut c_void,
            t: *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
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
    pub unsafe fn dflash_nccl_allreduce_mean(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
}

struct Store(*mut c_void);
// SAFETY: the store is a c10d::HashStore, which is thread-safe; we only pass the pointer around.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: made by dflash_store_new, freed once.
        unsafe { ffi::dflash_store_free(self.0) }
    }
}

/// The group of `size` ranks in this process.
pub struct NcclGroup {
    store: Arc<Store>,
    size: usize,
}

impl NcclGroup {
    pub fn new(size: usize) -> Result<NcclGroup> {
        if !AVAILABLE {
            bail!("this build has no NCCL shim (the wheel's NCCL/CUDA headers were missing at build time)");
        }
        // SAFETY: no preconditions.
        let store = unsafe { ffi::dflash_store_new() };
        Ok(NcclGroup {
            store: Arc::new(Store(store)),
            size,
        })
    }

    /// Rank `rank`'s handle; its process group is made on first use, on the rank's own thread.
    pub fn member(&self, rank: usize) -> NcclMember {
        NcclMember {
            store: self.store.clone(),
            rank,
            size: self.size,
            pg: std::ptr::null_mut(),
        }
    }
}

pub struct NcclMember {
    store: Arc<Store>,
    rank: usize,
    size: usize,
    pg: *mut c_void,
}

// SAFETY: a member is used by the one drafter thread it is handed to.
unsafe impl Send for NcclMember {}

fn error_text(buf: &[u8]) -> String {
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

impl GradMean for NcclMember {
    fn mean(&mut self, flat: &mut Tensor) -> Result<()> {
        let mut err = vec![0u8; 1024];
        if self.pg.is_null() {
            // SAFETY: the store outlives the member (Arc); err is a writable buffer of its length.
            self.pg = unsafe {
                ffi::dflash_nccl_new(
                    self.store.0,
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
        }
        // SAFETY: pg is live; the tensor pointer is tch's at::Tensor*, valid for this call.
        let rc = unsafe {
            ffi::dflash_nccl_allreduce_mean(
                self.pg,
                flat.as_mut_ptr() as *mut c_void,
                err.as_mut_ptr() as *mut c_char,
                err.len(),
            )
        };
        if rc != 0 {
            bail!(
                "NCCL all-reduce on rank {}: {}",
                self.rank,
                error_text(&err)
            );
        }
        Ok(())
    }

    fn world(&self) -> usize {
        self.size
    }

    /// Always, also at world size 1 (the forced one-GPU check of this path).
    fn syncs(&self) -> bool {
        true
    }
}

impl Drop for NcclMember {
    fn drop(&mut self) {
        if !self.pg.is_null() {
            // SAFETY: made by dflash_nccl_new, freed once.
            unsafe { ffi::dflash_nccl_free(self.pg) }
        }
    }
}
