//! System probes: per-thread CPU and GPUs. Both optional; the hub samples them at their own rates.

pub mod cpu;
pub mod gpu;
