//! One file per panel; each renders from the snapshot only.

pub mod charts;
pub mod gpus;
pub mod header;
pub mod help;
pub mod phases;
pub mod queues;
pub mod shares;
pub mod stacked;
pub mod summary;
pub mod thread_detail;
pub mod threads;
pub mod timeline;
pub mod warnings;
