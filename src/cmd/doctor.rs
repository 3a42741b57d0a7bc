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
    let _ = writeln!(out, "masked rows     {}", masked_rows_on(tch::Device::Cpu));
    if cuda {
        let _ = writeln!(
            out,
            "masked rows     {}",
            masked_rows_on(tch::Device::Cuda(0))
        );
    }
    let _ = writeln!(
        out,
        "NCCL shim       {}",
        if crate::engine::parallel::nccl::AVAILABLE {
            "built in"
        } else {
            "not built (multi-GPU replicas unavailable)"
        }
    );
    let _ = writeln!(
        out,
        "CUDA shim       {}",
        if crate::cuda_shim::AVAILABLE {
            "built in (a stream per worker, events timing)"
        } else {
            "not built (default streams; events timing unavailable)"
        }
    );
    if cuda && crate::cuda_shim::AVAILABLE {
        let kernels = match crate::engine::gpu::cuda::runtime_kernels_check(tch::Device::Cuda(0)) {
            Ok(()) => "compiled with NVRTC and ran on cuda:0 (the target's, AdamW's)".to_string(),
            Err(why) => format!("unavailable on cuda:0 ({why:#}): libtorch's ops run instead"),
        };
        let _ = writeln!(out, "our kernels     {kernels}");
    }
    let _ = writeln!(out, "FP8 target      {}", fp8_target_line(cuda));
    gpu_lines(&mut out);
    cpu_lines(&mut out);
    let _ = writeln!(out, "profiler clock  {}", clock::source());
    let _ = writeln!(
        out,
        "CPU threads     {} (libtorch intra-op default {})",
        num_cpus(),
        tch::get_num_threads()
    );
    out
}

/// Whether `--target-precision fp8` runs on cuda:0's FP8 tensor cores (one small scaled GEMM), or
/// on the CPU only emulated.
fn fp8_target_line(cuda: bool) -> String {
    if !cuda {
        return "emulated on the CPU (--target-precision fp8 shows its numbers, at no gain in \
                speed)"
            .into();
    }
    match crate::engine::model::fp8::check_device(tch::Device::Cuda(0)) {
        Ok(()) => "FP8 GEMMs run on cuda:0 (--target-precision fp8)".into(),
        Err(why) => format!("unavailable on cuda:0: {why:#}"),
    }
}

/// NVML: each device, the `cuda:N` it is in this process, bandwidth, throttle reasons.
fn gpu_lines(out: &mut String) {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES");
    let gpus = match GpuProbe::open().sample() {
        Ok(g) => g,
        Err(why) => {
            let _ = writeln!(out, "NVML            {why}");
            return;
        }
    };
    let _ = writeln!(
        out,
        "NVML            present, {} GPU(s); CUDA_VISIBLE_DEVICES {}",
        gpus.len(),
        visible.as_deref().unwrap_or("unset (all visible)")
    );
    let mixed = gpus.windows(2).any(|w| w[0].name != w[1].name);
    let bus_order = std::env::var("CUDA_DEVICE_ORDER").is_ok_and(|o| o == "PCI_BUS_ID");
    if mixed && !bus_order {
        let _ = writeln!(
            out,
            "  note          GPUs of several models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA may \
             number them fastest first, not as matched here; set CUDA_DEVICE_ORDER=PCI_BUS_ID"
        );
    }
    for g in gpus {
        let cuda = g
            .cuda
            .map(|n| format!("cuda:{n}"))
            .unwrap_or_else(|| "hidden".into());
        let throttle = if g.throttle.is_empty() {
            "none".to_string()
        } else {
            g.throttle.join(",")
        };
        let _ = writeln!(
            out,
            "  gpu {} = {cuda:<7} {}, {} MiB, {}% util, {}% mem bw, {:.0} W, {} MHz, {} C, throttle {throttle}",
            g.index,
            g.name,
            g.mem_total_mib,
            g.util_pct,
            g.mem_bw_pct,
            g.power_w,
            g.sm_clock_mhz,
            g.temp_c
        );
    }
}

/// The /proc task reader: threads, their states, what a refresh costs; memory from sysinfo.
fn cpu_lines(out: &mut String) {
    let mut cpu = CpuProbe::new();
    cpu.sample();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let t0 = std::time::Instant::now();
    let sample = cpu.sample();
    let us = t0.elapsed().as_secs_f64() * 1e6;
    let Some(s) = sample else {
        let _ = writeln!(out, "per-thread CPU  not readable (/proc/self/task/*/stat)");
        return;
    };
    let mut states: Vec<char> = s.threads.values().map(|t| t.state).collect();
    states.sort();
    states.dedup();
    let states: String = states.into_iter().collect();
    let _ = writeln!(
        out,
        "per-thread CPU  /proc/self/task: {} threads (states {states}), one refresh {us:.0} us",
        s.threads.len()
    );
    let _ = match s.memory {
        Some(m) => writeln!(
            out,
            "memory          this process {} MiB resident; host {} / {} MiB used",
            m.rss_mib, m.host_used_mib, m.host_total_mib
        ),
        None => writeln!(out, "memory          not readable through sysinfo"),
    };
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

/// What scaled_dot_product_attention returns for a fully masked row on `device` (bf16), and what
/// the engine's masked attention returns.
pub fn masked_rows_on(device: tch::Device) -> String {
    use tch::{Kind, Tensor};
    let q = Tensor::randn([1, 2, 3, 8], (Kind::BFloat16, device));
    let k = Tensor::randn([1, 2, 4, 8], (Kind::BFloat16, device));
    let mask = Tensor::ones([1, 1, 3, 4], (Kind::Bool, device));
    let _ = mask.get(0).get(0).get(1).fill_(0);
    let raw =
        Tensor::scaled_dot_product_attention(&q, &k, &k, Some(&mask), 0.0, false, None, false);
    let row = raw.get(0).get(0).get(1).to_kind(Kind::Float);
    let raw_state = if bool::try_from(row.isnan().any()).unwrap_or(false) {
        "NaN"
    } else if f64::try_from(row.abs().sum(Kind::Float)).unwrap_or(1.0) == 0.0 {
        "zeros"
    } else {
        "non-zero values"
    };
    let ours = crate::engine::model::layers::masked_attention(&q, &k, &k, &mask)
        .get(0)
        .get(0)
        .get(1)
        .to_kind(Kind::Float);
    let ours_zero = f64::try_from(ours.abs().sum(Kind::Float))
        .map(|v| v == 0.0)
        .unwrap_or(false);
    format!(
        "fully masked SDPA row on {:?}: {raw_state}; engine gives {}",
        device,
        if ours_zero { "zeros" } else { "NOT zeros" }
    )
}

#[cfg(test)]
mod tests {
    /// On a GPU host our kernels compile and run, and the report says so in one line; a
    /// failure to compile, load or launch either program would turn it into the fallback's line.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_report_says_our_kernels_compiled_and_ran_on_cuda() {
        if crate::engine::gpu::cuda::cuda_or_skip("our kernels").is_none() {
            return;
        }
        let report = super::report();
        let lines: Vec<&str> = report
            .lines()
            .filter(|l| l.starts_with("our kernels"))
            .collect();
        assert_eq!(
            lines,
            ["our kernels     compiled with NVRTC and ran on cuda:0 (the target's, AdamW's)"],
            "{report}"
        );
        // An H100 or H200 (the GPU host's) has FP8 tensor cores.
        assert!(
            report.contains("FP8 target      FP8 GEMMs run on cuda:0"),
            "{report}"
        );
    }
}
