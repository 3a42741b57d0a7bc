//! Integration tests, one binary.

mod cli;
mod engine;
mod runs;
mod telemetry_core;
