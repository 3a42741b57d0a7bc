//! The wire: a producer of telemetry (our trainer, or a Python pipeline through
//! python/dflash_top) serves raw records and queue samples on a local Unix socket; a viewer
//! (`dflash-top attach`, through join.rs) runs the hub on them. A recording is the same stream in a file.
//! The protocol is documented in docs/protocol.md.

pub mod fanout;
pub mod join;
pub mod join_many;
pub mod merge;
pub mod mirror;
pub mod protocol;
pub mod recording;
pub mod replay;
pub mod serve;
