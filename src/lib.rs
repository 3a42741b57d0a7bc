//! dflash-top: train a DFlash drafter on libtorch and watch every thread of the pipeline live.

pub mod cancel;
pub mod cmd;
pub mod config;
pub mod cuda_shim;
pub mod engine;
pub mod fail_if;
pub mod fault;
pub mod headless;
pub mod job;
pub mod probe;
pub mod progress;
pub mod quiet_panic;
pub mod save_layout;
pub mod scratch;
pub mod signals;
pub mod summary;
pub mod telemetry;
pub mod tui;
pub mod wire;
