//! libtorch's distributed pieces for jobs of several processes, through the shim
//! src/engine/cxx/c10d_shim.cpp: the job's rendezvous store (`c10d::TCPStore` at
//! MASTER_ADDR:MASTER_PORT, keys under a per-job prefix) and the CPU process group
//! (`c10d::ProcessGroupGloo`). The NCCL group of src/engine/parallel/nccl.rs meets in the same store.

use super::shim::{checked, made};
use anyhow::{bail, Result};
use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;
use tch::Tensor;

/// Whether this build carries the shim (it needs only libtorch's headers: every build with a
/// libtorch from the PyTorch wheel has it).
pub const AVAILABLE: bool = cfg!(c10d_shim);

#[cfg(c10d_shim)]
mod ffi {
    use super::*;
    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn dflash_tcpstore_new(
            host: *const c_char,
            port: c_int,
            is_server: c_int,
            world: c_int,
            timeout_ms: c_int,
            prefix: *const c_char,
            err: *mut c_char,
            len: usize,
        ) -> *mut c_void;
        pub fn dflash_c10d_store_free(s: *mut c_void);
        pub fn dflash_c10d_quiet();
        pub fn dflash_store_set(
            s: *mut c_void,
            key: *const c_char,
            value: *const u8,
            n: usize,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        #[allow(clippy::too_many_arguments)]
        pub fn dflash_store_try_get(
            s: *mut c_void,
            key: *const c_char,
            out: *mut u8,
            cap: usize,
            n: *mut usize,
            found: *mut c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn dflash_store_add(
            s: *mut c_void,
            key: *const c_char,
            delta: i64,
            out: *mut i64,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn dflash_store_delete(
            s: *mut c_void,
            key: *const c_char,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn dflash_gloo_new(
            s: *mut c_void,
            rank: c_int,
            size: c_int,
            timeout_ms: c_int,
            err: *mut c_char,
            len: usize,
        ) -> *mut c_void;
        pub fn dflash_gloo_free(g: *mut c_void);
        pub fn dflash_gloo_allreduce_sum(
            g: *mut c_void,
            t: *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        pub fn dflash_gloo_broadcast(
            g: *mut c_void,
            t: *mut c_void,
            root: c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
    }
}

/// Stand-ins for a build without the shim: every call fails (AVAILABLE says so first).
#[cfg(not(c10d_shim))]
#[allow(clippy::too_many_arguments)]
mod ffi {
    use super::*;
    const NONE: *mut c_void = std::ptr::null_mut();
    pub unsafe fn dflash_tcpstore_new(
        _: *const c_char,
        _: c_int,
        _: c_int,
        _: c_int,
        _: c_int,
        _: *const c_char,
        _: *mut c_char,
        _: usize,
    ) -> *mut c_void {
        NONE
    }
    pub unsafe fn dflash_c10d_store_free(_: *mut c_void) {}
    pub unsafe fn dflash_c10d_quiet() {}
    pub unsafe fn dflash_store_set(
        _: *mut c_void,
        _: *const c_char,
        _: *const u8,
        _: usize,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_store_try_get(
        _: *mut c_void,
        _: *const c_char,
        _: *mut u8,
        _: usize,
        _: *mut usize,
        _: *mut c_int,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_store_add(
        _: *mut c_void,
        _: *const c_char,
        _: i64,
        _: *mut i64,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_store_delete(
        _: *mut c_void,
        _: *const c_char,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_gloo_new(
        _: *mut c_void,
        _: c_int,
        _: c_int,
        _: c_int,
        _: *mut c_char,
        _: usize,
    ) -> *mut c_void {
        NONE
    }
    pub unsafe fn dflash_gloo_free(_: *mut c_void) {}
    pub unsafe fn dflash_gloo_allreduce_sum(
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
    pub unsafe fn dflash_gloo_broadcast(
        _: *mut c_void,
        _: *mut c_void,
        _: c_int,
        _: *mut c_char,
        _: usize,
    ) -> c_int {
        1
    }
}

fn c_text(s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| anyhow::anyhow!("{s:?} holds a NUL byte"))
}

/// Where the job's processes meet: a `c10d::TCPStore` (rank 0, or torchrun's agent, hosts it).
/// Thread-safe: libtorch's client serializes its requests.
pub struct JobStore {
    ptr: *mut c_void,
}

// SAFETY: c10d::TCPStore and PrefixStore guard their socket with a lock; the pointer is only
// handed to the shim.
unsafe impl Send for JobStore {}
unsafe impl Sync for JobStore {}

impl JobStore {
    /// Joins (or, as `host_it`, hosts) the store at `addr:port`, keys under `prefix`; waits up
    /// to `timeout` for the host to listen.
    pub fn connect(
        addr: &str,
        port: u16,
        host_it: bool,
        world: u32,
        timeout: Duration,
        prefix: &str,
    ) -> Result<JobStore, String> {
        if !AVAILABLE {
            return Err("this build has no c10d shim (libtorch's headers were missing when it was built): rebuild with LIBTORCH set".into());
        }
        let (host, prefix) = (
            c_text(addr).map_err(|e| e.to_string())?,
            c_text(prefix).map_err(|e| e.to_string())?,
        );
        // SAFETY: sets a logging level; no preconditions.
        unsafe { ffi::dflash_c10d_quiet() };
        // SAFETY: the strings live for the call; e is a writable buffer of l bytes.
        let ptr = made(|e, l| unsafe {
            ffi::dflash_tcpstore_new(
                host.as_ptr(),
                port as c_int,
                host_it as c_int,
                world as c_int,
                timeout.as_millis().min(i32::MAX as u128) as c_int,
                prefix.as_ptr(),
                e,
                l,
            )
        })?;
        Ok(JobStore { ptr })
    }

    /// The `c10::intrusive_ptr<c10d::Store>*` the process-group shims take.
    pub fn raw(&self) -> *mut c_void {
        self.ptr
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        let k = c_text(key).map_err(|e| e.to_string())?;
        // SAFETY: key and value live for the call.
        checked(|e, l| unsafe {
            ffi::dflash_store_set(self.ptr, k.as_ptr(), value.as_ptr(), value.len(), e, l)
        })
    }

    /// The value of `key`, None while it is not set.
    pub fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, String> {
        let k = c_text(key).map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        loop {
            let (mut n, mut found) = (0usize, 0 as c_int);
            // SAFETY: buf is writable for its length; n and found are live.
            checked(|e, l| unsafe {
                ffi::dflash_store_try_get(
                    self.ptr,
                    k.as_ptr(),
                    buf.as_mut_ptr(),
                    buf.len(),
                    &mut n,
                    &mut found,
                    e,
                    l,
                )
            })?;
            if found == 0 {
                return Ok(None);
            }
            if n <= buf.len() {
                buf.truncate(n);
                return Ok(Some(buf));
            }
            buf.resize(n, 0);
        }
    }

    /// Adds `delta` to the counter `key` (0 when new) and returns its new value; `add(key, 0)`
    /// reads it.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, String> {
        let k = c_text(key).map_err(|e| e.to_string())?;
        let mut out = 0i64;
        // SAFETY: key and out live for the call.
        checked(|e, l| unsafe {
            ffi::dflash_store_add(self.ptr, k.as_ptr(), delta, &mut out, e, l)
        })?;
        Ok(out)
    }
}

impl JobStore {
    /// Removes `key` (a key that was never set is no error).
    pub fn delete(&self, key: &str) -> Result<(), String> {
        let k = c_text(key).map_err(|e| e.to_string())?;
        // SAFETY: key lives for the call.
        checked(|e, l| unsafe { ffi::dflash_store_delete(self.ptr, k.as_ptr(), e, l) })
    }
}

impl Drop for JobStore {
    fn drop(&mut self) {
        // SAFETY: made by dflash_tcpstore_new, freed once.
        unsafe { ffi::dflash_c10d_store_free(self.ptr) }
    }
}

/// This process's rank in the job's CPU process group.
pub struct GlooGroup {
    ptr: *mut c_void,
    pub rank: u32,
    pub size: u32,
}

// SAFETY: used by one thread at a time (the drafter's); ProcessGroupGloo runs its collectives
// on threads of its own.
unsafe impl Send for GlooGroup {}

impl GlooGroup {
    /// Connects rank `rank` of `size` to the others through `store`; a collective that waits
    /// longer than `timeout` for a peer fails.
    pub fn new(store: &JobStore, rank: u32, size: u32, timeout: Duration) -> Result<GlooGroup> {
        // SAFETY: the store is live; e is a writable buffer of l bytes.
        let ptr = made(|e, l| unsafe {
            ffi::dflash_gloo_new(
                store.raw(),
                rank as c_int,
                size as c_int,
                timeout.as_millis().min(i32::MAX as u128) as c_int,
                e,
                l,
            )
        })
        .map_err(|e| anyhow::anyhow!("Gloo process group for rank {rank} of {size}: {e}"))?;
        Ok(GlooGroup { ptr, rank, size })
    }

    /// `t` (a CPU tensor) becomes its sum over the ranks, the same bits on every rank.
    pub fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<()> {
        let ptr = self.ptr;
        // SAFETY: the group and the tensor are live for the call.
        let r = checked(|e, l| unsafe {
            ffi::dflash_gloo_allreduce_sum(ptr, t.as_mut_ptr() as *mut c_void, e, l)
        });
        if let Err(e) = r {
            bail!("all-reduce across ranks (Gloo): {e}");
        }
        Ok(())
    }

    /// `t` becomes rank `root`'s `t`.
    pub fn broadcast(&mut self, t: &mut Tensor, root: u32) -> Result<()> {
        let ptr = self.ptr;
        // SAFETY: the group and the tensor are live for the call.
        let r = checked(|e, l| unsafe {
            ffi::dflash_gloo_broadcast(ptr, t.as_mut_ptr() as *mut c_void, root as c_int, e, l)
        });
        if let Err(e) = r {
            bail!("broadcast from rank {root} (Gloo): {e}");
        }
        Ok(())
    }
}

impl Drop for GlooGroup {
    fn drop(&mut self) {
        // SAFETY: made by dflash_gloo_new, freed once.
        unsafe { ffi::dflash_gloo_free(self.ptr) }
    }
}

/// A free TCP port of this host (bound, then let go): the tests' MASTER_PORT.
#[cfg(test)]
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[cfg(test)]
mod tests;
