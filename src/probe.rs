//! System probes of this process: per-thread CPU and OS state from its own /proc task list,
//! memory (sysinfo, this pid only), GPUs (NVML) matched to its `cuda:N`, and libtorch's caching
//! allocator on them. All optional; the hub
//! samples them at their own rates. And whether another process is still there (`alive`).

pub mod allocator;
pub mod cpu;
pub mod gpu;
pub mod visible;

/// Whether process `pid` is still running (its /proc entry exists): a socket or a temporary
/// directory named after a process that is gone can be cleared away.
pub fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The OS thread id of the caller (what /proc/self/task lists).
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}
