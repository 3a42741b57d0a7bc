//! The GPU room: the CUDA shim and its kernels (cuda), CUPTI's launch counts (cupti), the fast
//! paths a run may turn off (fast_paths), the one device read-back a step makes (host_sync) and
//! device time by kernel class over a window (kernel_time).
//! Near the ground: it uses nothing else of the engine but the spec's types.

pub mod alloc_conf;
pub mod cuda;
pub mod cupti;
pub mod fast_paths;
pub mod host_sync;
pub mod kernel_time;
