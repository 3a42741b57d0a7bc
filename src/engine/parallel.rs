//! Several drafters and several processes: replicas on one host and their gradient
//! reduction (replicas, nccl), torchrun-style jobs over libtorch's c10d (c10d, ranks) and a
//! replica in another process (rank_replica); calling the C++ shims of c10d and NCCL (shim).
//! Beside the pipeline, which starts it.

pub mod c10d;
pub mod nccl;
pub mod rank_replica;
pub mod ranks;
pub mod replicas;
mod shim;
