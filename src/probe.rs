//! System probes of this process: per-thread CPU and OS state from its own /proc task list,
//! memory (sysinfo, this pid only), and GPUs (NVML) matched to its `cuda:N`. All optional; the hub
//! samples them at their own rates.

pub mod cpu;
pub mod gpu;
pub mod owner;
pub mod visible;
