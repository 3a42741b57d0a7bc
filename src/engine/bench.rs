//! Measurements of the engine's parts: the drafter's step alone (drafter) and replicas
//! against one drafter (replica_check). Uses the rooms below it; the `bench` command runs it.

pub mod drafter;
pub mod replica_check;
