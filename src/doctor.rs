//! `dflash-top doctor`: what this machine offers the program.

use crate::probe::cpu::CpuProbe;
use crate::probe::gpu::GpuProbe;
use crate::telemetry::clock;
use std::fmt::Write;

/// The report as lines; never fails (each missing part is a line saying so).
pub fn report() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "libtorch        {}", libtorch_version());
    let cuda = tch::Cuda::is_available();
    let _ = writeln!(
        out,
        "CUDA            {}",
        if cuda {
            format!(
                "available, {} device(s), cuDNN {}",
                tch::Cuda::device_count(),
                tch::Cuda::cudnn_is_available()
            )
        } else {
            "not available".to_string()
        }
    );
    match GpuProbe::open().sample() {
        Ok(gpus) => {
            let _ = writeln!(out, "NVML            present, {} GPU(s)", gpus.len());
            for g in gpus {
                let _ = writeln!(
                    out,
                    "  gpu {}         {}, {} MiB, {}% util, {:.0} W, {} MHz, {} C",
                    g.index,
                    g.name,
                    g.mem_total_mib,
                    g.util_pct,
                    g.power_w,
                    g.sm_clock_mhz,
                    g.temp_c
                );
            }
        }
        Err(why) => {
            let _ = writeln!(out, "NVML            {why}");
        }
    }
    let mut cpu = CpuProbe::new();
    cpu.sample();
    std::thread::sleep(std::time::Duration::from_millis(100));
    match cpu.sample() {
        Some(t) => {
            let _ = writeln!(
                out,
                "per-thread CPU  readable ({} threads of this process)",
                t.len()
            );
        }
        None => {
            let _ = writeln!(out, "per-thread CPU  not readable (/proc/self/task)");
        }
    }
    let _ = writeln!(out, "profiler clock  {}", clock::source());
    let _ = writeln!(
        out,
        "CPU threads     {} (libtorch intra-op default {})",
        num_cpus(),
        tch::get_num_threads()
    );
    out
}

/// The version of the libtorch this process loaded: torch/version.py beside the mapped
/// libtorch_cpu.so (the PyTorch wheel's layout), else the library's path.
pub fn libtorch_version() -> String {
    // Touch libtorch so that it is mapped before we look.
    let _ = tch::utils::has_cuda();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let Some(lib) = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("libtorch_cpu.so"))
    else {
        return "loaded (version unknown)".to_string();
    };
    let lib = std::path::Path::new(lib);
    let version_py = lib
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("version.py"));
    let version = version_py
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("__version__"))
                .and_then(|l| l.split('\'').nth(1))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "version unknown".to_string());
    format!("{version} ({})", lib.display())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}
