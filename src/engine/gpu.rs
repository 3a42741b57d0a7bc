//! The GPU room: the CUDA shim and its kernels (cuda), CUPTI's launch counts (cupti), the fast
//! paths a run may turn off (fast_paths) and the one device read-back a step makes (host_sync).
//! Near the ground: it uses nothing else of the engine but the spec's types.

pub mod cuda;
pub mod cupti;
pub mod fast_paths;
pub mod host_sync;
