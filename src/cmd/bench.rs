//! `dflash-top bench`: the engine's throughput and phase times, and side-by-side comparisons in
//! one run — GPU timing modes (`modes`) and profiling on vs off (`profiling`) — where the
//! settings take turns on the same pipeline, so a shared machine's drift hits both alike. In
//! `bench/`: `rates.rs` the per-thread lines (phases, CUDA calls, FLOP rates), `alternate.rs`
//! the settings' turns, `replicas.rs` the replica check.

use crate::cmd::session::Session;
use crate::config::cli::{BenchArgs, BENCHES};
use crate::config::RunConfig;
use crate::engine::gpu::kernel_time::KernelTally;
use crate::engine::spec::PipelineSpec;
use crate::telemetry::{GpuTiming, HubCommand, Phase, Role};
use anyhow::{bail, Context, Result};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod alternate;
mod rates;
mod replicas;
use alternate::{alternate, Setting};
use rates::{cuda_calls_line, drafter_rate_line, phase_line, target_rate_line};
use replicas::replicas;

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    if !args.train.fail_if.is_empty() || args.train.flight.is_some() {
        bail!(
            "--fail-if and --flight watch `train --headless` and `attach`, not bench: leave them out"
        );
    }
    let what = args.what.as_str();
    if !BENCHES.contains(&what) {
        let (last, rest) = BENCHES.split_last().expect("benches are named");
        bail!("bench `{what}`: use {} or {last}", rest.join(", "));
    }
    if args.kernels.is_some() && what != "engine" && what != "drafter" {
        bail!(
            "--kernels times the kernels of `bench engine` or `bench drafter`: leave it out of \
             bench {what}"
        );
    }
    if what == "telemetry" {
        let on = crate::telemetry::hub::measure_mark_cost();
        crate::signals::outln!(
            "bench: phase mark with profiling on: {on:.1} ns (clock {})",
            crate::telemetry::clock::source()
        );
        return Ok(crate::cmd::session::signal_exit());
    }
    // The configuration, resolved once: `engine` trains 60 steps unless told, `modes` and
    // `profiling` until their turns end; the others read --steps themselves.
    let mut train = args.train.clone();
    if args.kernels.is_some() {
        if train.cupti.as_deref() == Some("on") {
            bail!(
                "--kernels and --cupti on both need CUPTI, which takes one subscriber a process: \
                 leave --cupti out"
            );
        }
        train.cupti = Some("off".into());
        // Snapshots every 0.1 s: the window's first step is read within a tenth of a second of
        // the profiler going on.
        train.interval = Some(train.interval.unwrap_or(0.1));
    }
    match what {
        "engine" => train.steps = Some(train.steps.unwrap_or(60)),
        "modes" | "profiling" => train.steps = None,
        _ => {}
    }
    let run = RunConfig::from_args(&train)?;
    let fp8 = crate::engine::model::fp8::TargetPrecision::Fp8;
    if what == "generate" && run.pipeline.target_precision == fp8 {
        bail!(
            "--target-precision fp8 (or the TOML's target_precision) sets training's target; bench \
             generate decodes in bf16: leave it out"
        );
    }
    // `generate` runs no pipeline: CUPTI stays as asked, unapplied.
    let run = if what == "generate" {
        run
    } else {
        run.apply()?
    };
    match what {
        "engine" => engine(&run, args.kernels)?,
        "modes" => {
            let settings = GpuTiming::ALL.map(|m| Setting {
                name: m.name(),
                command: HubCommand::SetGpuTiming(m),
            });
            alternate(args, &run, &settings)?;
        }
        "profiling" => {
            let settings = [true, false].map(|on| Setting {
                name: if on { "profiling-on" } else { "profiling-off" },
                command: HubCommand::SetProfiling(on),
            });
            alternate(args, &run, &settings)?;
        }
        "replicas" => replicas(args, &run.pipeline)?,
        "drafter" => drafter(args, &run.pipeline)?,
        "precision" => precision(args, &run.pipeline)?,
        _ => generate(args, &run.pipeline)?,
    }
    Ok(crate::cmd::session::signal_exit())
}

/// `bench generate`: the preset's target (random weights, every layer) decoding one batch of
/// random prompts at each batch size of --gen-batches, greedy, no end token; new tokens a second
/// each, and each batch's rate over the first's.
fn generate(args: &BenchArgs, cfg: &PipelineSpec) -> Result<()> {
    use crate::engine::model::decode::{continuations, Decoding};
    let numbers = |text: &str, flag: &str| -> Result<Vec<usize>> {
        text.split(',')
            .map(|x| x.trim().parse().ok().filter(|&n| n >= 1))
            .collect::<Option<Vec<usize>>>()
            .with_context(|| format!("{flag} `{text}`: give positive numbers, comma-separated"))
    };
    let batches = numbers(&args.gen_batches, "--gen-batches")?;
    let (prompt_len, new) = match numbers(&args.gen_lengths, "--gen-lengths")?[..] {
        [p, n] => (p, n),
        _ => bail!("--gen-lengths `{}`: give PROMPT,NEW", args.gen_lengths),
    };
    let device = cfg.target_devices[0];
    let target = &cfg.target_config;
    let vs = tch::nn::VarStore::new(device);
    tch::manual_seed(cfg.seed as i64);
    crate::engine::model::decode::set_threads_for(device, target);
    let mut model = crate::engine::model::qwen3::Qwen3Target::new_full(&vs.root(), target, 0.02);
    model.fuse_projections();
    let mut vs = vs;
    vs.freeze();
    if device.is_cuda() {
        vs.set_kind(tch::Kind::BFloat16);
    }
    let vocab = target.vocab_size.min(32_000);
    let prompts = |n: usize| -> Vec<Vec<i64>> {
        (0..n)
            .map(|r| {
                (0..prompt_len)
                    .map(|j| ((r * 7919 + j * 104_729) as i64) % vocab)
                    .collect()
            })
            .collect()
    };
    let decode = |rows: usize, new: usize| -> Result<f64> {
        let p = prompts(rows);
        let refs: Vec<&[i64]> = p.iter().map(Vec::as_slice).collect();
        let how = Decoding {
            temperature: 0.0,
            max_new_tokens: new,
        };
        let sync = || {
            if let tch::Device::Cuda(i) = device {
                tch::Cuda::synchronize(i as i64);
            }
        };
        sync();
        let t0 = Instant::now();
        let out = continuations(&model, &refs, &[], how, device, &mut |_| false)
            .context("decoding stopped")?;
        sync();
        let made: usize = out.iter().map(Vec::len).sum();
        Ok(made as f64 / t0.elapsed().as_secs_f64())
    };
    decode(batches[0], 4)?; // warm-up
    let mut first = None;
    for &b in &batches {
        // A signal, or a reader that left (`print_line` below), ends the batches left.
        if crate::signals::requested() {
            break;
        }
        let rate = decode(b, new)?;
        let base = *first.get_or_insert(rate);
        crate::signals::print_line(&format!(
            "bench: generate preset={} device={} batch={b} prompt={prompt_len} new={new} \
             tok/s={rate:.0} vs_batch{}={:.2}x",
            cfg.preset.name,
            crate::engine::pipeline::workers::device_name(device),
            batches[0],
            rate / base
        ));
    }
    Ok(())
}

/// `bench precision`: the target in bf16 and in FP8 on --steps (default 4) batches of the run's
/// data; each captured layer's relative error and cosine.
fn precision(args: &BenchArgs, cfg: &PipelineSpec) -> Result<()> {
    let batches = args.train.steps.unwrap_or(4) as usize;
    let gap = crate::engine::bench::precision::run(cfg, batches)?;
    crate::signals::outln!(
        "bench: target precision fp8 against {} target={} device={:?} batches={} tokens={} \
         row_kernel={}",
        if cfg.target_devices[0].is_cuda() {
            "bf16"
        } else {
            "f32 (the CPU's)"
        },
        cfg.target_label(),
        cfg.target_devices[0],
        batches.max(1),
        gap.tokens,
        crate::engine::gpu::cuda::fp8_kernel_state(),
    );
    for l in &gap.layers {
        crate::signals::outln!(
            "bench: captured layer {}: relative error {:.4} cosine {:.6}",
            l.layer,
            l.relative_error,
            l.cosine
        );
    }
    Ok(())
}

/// `bench drafter`: the drafter alone for --steps (default 20) timed steps on hidden states its
/// target computed first; each phase's device time and TFLOP/s-equivalent.
fn drafter(args: &BenchArgs, cfg: &PipelineSpec) -> Result<()> {
    let steps = args.train.steps.unwrap_or(20);
    if args.kernels.is_some() && !cfg.drafter_devices[0].is_cuda() {
        bail!("--kernels times CUDA kernels: put the drafter on a GPU (--drafter-devices)");
    }
    let (times, tally) = crate::engine::bench::drafter::run(cfg, steps, args.kernels.is_some())?;
    let f = crate::engine::model::flops::drafter_flops(
        &cfg.drafter_spec,
        cfg.seq_len,
        cfg.anchors,
        None,
    );
    let rows = cfg.batch as f64;
    crate::signals::outln!(
        "bench: drafter alone preset={} batch={} seq_len={} anchors={} device={:?} steps={steps} \
         step_ms={:.1} tok/s={:.0}",
        cfg.preset.name,
        cfg.batch,
        cfg.seq_len,
        cfg.anchors,
        cfg.drafter_devices[0],
        times.step_ms(),
        rows * cfg.seq_len as f64 / (times.step_ms() / 1e3)
    );
    let phases: Vec<String> = times
        .ms
        .iter()
        .map(|(p, _)| format!("{}={:.1}", p.name(), times.per_step(*p)))
        .collect();
    crate::signals::outln!("bench: drafter ms a step: {}", phases.join(" "));
    let rate = |flops: f64, ms: f64| flops * rows / (ms / 1e3) / 1e12;
    let (fw, lo, bw) = (
        times.per_step(Phase::Forward),
        times.per_step(Phase::Loss),
        times.per_step(Phase::Backward),
    );
    crate::signals::outln!(
        "bench: drafter TFLOP/s-equivalent alone ({:.1} TFLOP a batch): forward={:.0} loss={:.0} \
         backward={:.0} together={:.0}",
        f.step() * rows / 1e12,
        rate(f.forward, fw),
        rate(f.loss, lo),
        rate(f.backward, bw),
        rate(f.step(), fw + lo + bw)
    );
    if let (Some(tally), Some(top)) = (tally, args.kernels) {
        check_recorded(&tally, steps)?;
        kernel_lines(&tally, steps, top);
    }
    Ok(())
}

/// Trains for --steps (default 60) without printing; reports throughput over the last 10 s and
/// per-thread phase times; with `kernels` (how many to list), device time by class and kernel
/// over the run's last two thirds.
fn engine(run: &RunConfig, kernels: Option<usize>) -> Result<()> {
    use crate::engine::gpu::kernel_time::KernelWindow;
    let cfg = &run.pipeline;
    if kernels.is_some()
        && !cfg
            .target_devices
            .iter()
            .chain(&cfg.drafter_devices)
            .any(|d| d.is_cuda())
    {
        bail!("--kernels times CUDA kernels: put a worker on a GPU (--target-devices, --drafter-devices)");
    }
    let session = Session::start(run)?;
    let snapshots = session.telemetry.subscribe();
    let start_step = session.pipeline.start_step;
    // --kernels: the window opens a third of the way into the steps this run takes (graphs
    // captured, allocator warm); its first step is the first one seen after the profiler is on.
    let end = cfg.steps.unwrap_or(60);
    let open_at = (start_step + end.saturating_sub(start_step) / 3).max(start_step + 1);
    let mut window: Option<KernelWindow> = None;
    let mut from: Option<u64> = None;
    let mut failed: Option<anyhow::Error> = None;
    let mut last = None;
    while !session.pipeline.is_finished() && !crate::signals::requested() {
        if let Ok(s) = snapshots.recv_timeout(Duration::from_millis(50)) {
            if window.is_some() && from.is_none() {
                from = Some(s.train.step);
            }
            if kernels.is_some() && window.is_none() && s.train.step >= open_at {
                match KernelWindow::start() {
                    Ok(w) => window = Some(w),
                    // The run stops (finish, below) before the error is told.
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            last = Some(s);
        }
    }
    session.finish()?;
    if let Some(e) = failed {
        return Err(e);
    }
    while let Ok(s) = snapshots.try_recv() {
        last = Some(s);
    }
    let Some(s) = last else {
        bail!("the run ended before any snapshot")
    };
    let tally = match (window, from) {
        (Some(w), Some(from)) => {
            let tally = w.stop()?;
            let steps = s.train.step.saturating_sub(from);
            check_recorded(&tally, steps)?;
            Some((tally, steps))
        }
        (Some(w), None) => {
            w.stop()?;
            bail!("--kernels: the run ended as its window opened: raise --steps")
        }
        (None, _) if kernels.is_some() => {
            bail!("--kernels: the run ended before its window opened: raise --steps")
        }
        (None, _) => None,
    };
    // Replicas step together: the run's rate is one replica's.
    let drafter_steps: f64 = s
        .threads
        .iter()
        .filter(|t| t.role == Role::Drafter)
        .map(|t| t.w10.steps_per_s())
        .fold(0.0, f64::max);
    crate::signals::outln!(
        "bench: preset={} steps={} steps/s={:.2} tok/s={:.0} (last 10 s) devices target={:?} drafter={:?} timing={}",
        cfg.preset.name,
        s.train.step,
        drafter_steps,
        s.train.tok_per_s_10s,
        cfg.target_devices,
        cfg.drafter_devices,
        s.gpu_timing.map(|m| m.name()).unwrap_or("host")
    );
    for t in &s.threads {
        crate::signals::outln!("bench: {}", phase_line(t));
    }
    crate::signals::outln!("bench: {}", cuda_calls_line(cfg, &s));
    if let Some(line) = target_rate_line(cfg, &s) {
        crate::signals::outln!("bench: {line}");
    }
    if let Some(line) = drafter_rate_line(cfg, &s) {
        crate::signals::outln!("bench: {line}");
    }
    for line in memory_lines(cfg) {
        crate::signals::outln!("bench: {line}");
    }
    // The run's own FLOP estimate rides in its snapshots (set at start).
    let gpus = crate::config::cuda_count() as usize;
    let room = crate::config::room_on(gpus, &cfg.memory_need());
    if let Some((advice, source)) = crate::telemetry::placement::for_run(&s, gpus, room) {
        crate::signals::outln!(
            "bench: placement ({source}) {} ({})",
            advice.text(),
            advice.flags()
        );
    }
    crate::signals::outln!(
        "bench: target_precision={} fp8_rows={} optimizer_states={} cuda_alloc_conf={} target_attention={} \
         target_forward={} target_kernels={} drafter_step={} adamw_bf16={} drafter_attention={} \
         drafter_kernels={} gemm_grads={}",
        cfg.target_precision.name(),
        crate::engine::gpu::cuda::fp8_kernel_state(),
        cfg.optimizer_states.name(),
        crate::engine::gpu::alloc_conf::describe(),
        crate::engine::model::varlen::attention_used(),
        crate::engine::model::target_graph::state(),
        crate::engine::gpu::cuda::target_kernels_state(),
        crate::engine::train::step_graphs::state(),
        crate::engine::train::optim::bf16_kernel_state(),
        crate::engine::gpu::cuda::block_attention_state(),
        crate::engine::gpu::cuda::drafter_kernels_state(),
        crate::engine::gpu::cuda::gemm_grads_state()
    );
    if let (Some((tally, steps)), Some(top)) = (tally, kernels) {
        kernel_lines(&tally, steps, top);
    }
    crate::signals::outln!("{}", crate::headless::summary_line(&s, start_step));
    Ok(())
}

/// A `--kernels` window that holds no step or no kernel (CUPTI taken by nsys or ncu, or
/// missing) is an error, not a table of zeros.
fn check_recorded(tally: &KernelTally, steps: u64) -> Result<()> {
    if steps == 0 || tally.total_ns() == 0 {
        bail!(
            "--kernels: no step, or no CUDA kernel, was recorded in the window ({steps} steps, {} \
             kernels): raise --steps, and check that CUPTI is there and free (not under nsys or \
             ncu)",
            tally.by_class.iter().map(|c| c.0).sum::<u64>()
        );
    }
    Ok(())
}

/// `--kernels`' lines: device ms a step by class, then the `top` kernels with the most.
fn kernel_lines(tally: &KernelTally, steps: u64, top: usize) {
    crate::signals::outln!("bench: {}", tally.classes_line(steps));
    for line in tally.top_lines(steps, top) {
        crate::signals::outln!("bench: {line}");
    }
}

/// The caching allocator's peak per CUDA device the run used (what the batch, anchors and
/// sequence length cost in memory).
fn memory_lines(cfg: &PipelineSpec) -> Vec<String> {
    let mut devices: Vec<usize> = cfg
        .target_devices
        .iter()
        .chain(&cfg.drafter_devices)
        .filter_map(|d| match d {
            tch::Device::Cuda(i) => Some(*i),
            _ => None,
        })
        .collect();
    devices.sort_unstable();
    devices.dedup();
    devices
        .into_iter()
        .filter_map(|i| {
            let peak = crate::cuda_shim::memory_peak(i, false).ok()?;
            Some(format!(
                "memory cuda:{i} peak_allocated_gib={:.2}",
                peak as f64 / (1u64 << 30) as f64
            ))
        })
        .collect()
}
