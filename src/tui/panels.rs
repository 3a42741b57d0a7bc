//! One file per panel; each renders from the snapshot only.

pub mod charts;
pub mod gpus;
pub mod header;
pub mod help;
pub mod phases;
pub mod queues;
pub mod threads;
