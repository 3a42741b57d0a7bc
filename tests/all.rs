//! Integration tests, one binary.

mod architecture;
mod attach;
mod attention;
mod auto;
mod cli;
mod e2e;
mod engine;
mod fuzz;
mod generate;
mod healthy;
mod job;
mod job_view;
mod names;
mod parity;
mod probes;
mod quality;
mod reference;
mod reliability;
mod replay;
mod runs;
mod screens;
mod support;
mod telemetry_core;
mod telemetry_live;
mod tmux;
mod tui;
mod warnings;

/// The first CUDA device, or `None` where there is none, saying that `what` is not run: the
/// GPU-gated tests check on the GPU host and say so elsewhere.
pub fn cuda_or_skip(what: &str) -> Option<tch::Device> {
    if tch::Cuda::is_available() {
        Some(tch::Device::Cuda(0))
    } else {
        eprintln!("no CUDA device: {what} is not run here");
        None
    }
}

/// `cuda_or_skip` for what runs through the CUDA shim: `None` too where this build has none,
/// saying so.
pub fn cuda_shim_or_skip(what: &str) -> Option<tch::Device> {
    let dev = cuda_or_skip(what)?;
    if !dflash_top::cuda_shim::AVAILABLE {
        eprintln!("no CUDA shim in this build: {what} is not run here");
        return None;
    }
    Some(dev)
}
