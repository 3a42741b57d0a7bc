//! Integration tests, one binary.

mod cli;
mod engine;
mod telemetry_core;
