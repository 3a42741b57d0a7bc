//! Integration tests, one binary.

mod cli;
mod telemetry_core;
