//! Measurements of the engine's parts: the drafter's step alone (drafter), replicas against one
//! drafter (replica_check) and the FP8 target against the bf16 one (precision). Uses the rooms
//! below it; the `bench` command runs it.

pub mod drafter;
pub mod precision;
pub mod replica_check;
