//! Integration tests, one binary.

mod attach;
mod attention;
mod cli;
mod e2e;
mod engine;
mod fuzz;
mod generate;
mod probes;
mod reference;
mod reliability;
mod runs;
mod screens;
mod telemetry_core;
mod telemetry_live;
mod tmux;
mod tui;
