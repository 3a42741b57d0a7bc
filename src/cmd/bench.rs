//! `dflash-top bench`: the engine's throughput and phase times, and side-by-side comparisons in
//! one run — GPU timing modes (`modes`) and profiling on vs off (`profiling`) — where the
//! settings take turns on the same pipeline, so a shared machine's drift hits both alike.

use crate::cli::BenchArgs;
use crate::cmd::session::Session;
use crate::config::{PipelineSpec, RunConfig};
use crate::engine::flops::DrafterFlops;
use crate::telemetry::snapshot::ThreadView;
use crate::telemetry::{GpuTiming, HubCommand, Phase, Role, Snapshot};
use anyhow::{bail, Context, Result};
use crossbeam_channel::Receiver;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn run(args: &BenchArgs) -> Result<ExitCode> {
    if !args.train.fail_if.is_empty() || args.train.flight.is_some() {
        bail!(
            "--fail-if and --flight watch `train --headless` and `attach`, not bench: leave them out"
        );
    }
    match args.what.as_str() {
        "telemetry" => {
            let on = crate::telemetry::hub::measure_mark_cost();
            println!(
                "bench: phase mark with profiling on: {on:.1} ns (clock {})",
                crate::telemetry::clock::source()
            );
        }
        "engine" => engine(args)?,
        "modes" => {
            let settings = GpuTiming::ALL.map(|m| Setting {
                name: m.name(),
                command: HubCommand::SetGpuTiming(m),
            });
            alternate(args, &settings)?;
        }
        "profiling" => {
            let settings = [true, false].map(|on| Setting {
                name: if on { "profiling-on" } else { "profiling-off" },
                command: HubCommand::SetProfiling(on),
            });
            alternate(args, &settings)?;
        }
        "replicas" => replicas(args)?,
        "drafter" => drafter(args)?,
        "generate" => generate(args)?,
        other => {
            bail!("bench `{other}`: use engine, drafter, modes, profiling, replicas, generate or telemetry")
        }
    }
    Ok(crate::cmd::session::signal_exit())
}

/// `bench generate`: the preset's target (random weights, every layer) decoding one batch of
/// random prompts at each batch size of --gen-batches, greedy, no end token; new tokens a second
/// each, and each batch's rate over the first's.
fn generate(args: &BenchArgs) -> Result<()> {
    use crate::engine::decode::{continuations, Decoding};
    let cfg = RunConfig::from_args(&args.train)?.pipeline;
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
    crate::engine::decode::set_threads_for(device, target);
    let mut model = crate::engine::qwen3::Qwen3Target::new_full(&vs.root(), target, 0.02);
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
        let rate = decode(b, new)?;
        let base = *first.get_or_insert(rate);
        println!(
            "bench: generate preset={} device={} batch={b} prompt={prompt_len} new={new} \
             tok/s={rate:.0} vs_batch{}={:.2}x",
            cfg.preset.name,
            crate::engine::workers::device_name(device),
            batches[0],
            rate / base
        );
    }
    Ok(())
}

fn phase_line(t: &ThreadView) -> String {
    let w = &t.w10;
    let phases: Vec<String> = t
        .role
        .phases()
        .iter()
        .map(|p| format!("{}={:.1}", p.name(), w.ms_per_step(*p)))
        .collect();
    let idle = if w.gpu_idle_ns > 0 && w.wall_ns > 0 {
        format!(
            " gpu_idle={:.0}%",
            w.gpu_idle_ns as f64 / w.wall_ns as f64 * 100.0
        )
    } else {
        String::new()
    };
    format!(
        "{} step_ms={:.1} {}{idle}",
        t.name,
        w.step_ms(),
        phases.join(" ")
    )
}

/// `cuda_calls cupti=on | target-0 launches=412.0 launch_ms=3.12 cusync_ms=0.40 | …`: each
/// thread's CUDA kernel launches per step and ms per step in launch and sync calls over the last
/// 10 s, where CUPTI counts them (`--cupti`); `launches=n/a (why)` where not.
fn cuda_calls_line(cfg: &PipelineSpec, s: &Snapshot) -> String {
    let mut out = format!("cuda_calls cupti={}", cfg.cupti.field());
    for t in &s.threads {
        out.push_str(&match s.cuda_calls(t, &t.w10) {
            Ok((n, launch_ms, sync_ms)) => format!(
                " | {} launches={n:.1} launch_ms={launch_ms:.2} cusync_ms={sync_ms:.2}",
                t.name
            ),
            Err(why) => format!(" | {} launches=n/a ({why})", t.name),
        });
    }
    out
}

/// The target forward's rate in TFLOP/s-equivalent (`engine::flops::target_flops` over the forward
/// phase's device time), per target worker.
fn target_rate_line(cfg: &PipelineSpec, s: &Snapshot) -> Option<String> {
    let flops =
        crate::engine::flops::target_flops(&cfg.target_config, &cfg.drafter_spec, cfg.seq_len)
            * cfg.batch as f64;
    target_rates(flops, s)
}

/// `flops` a batch over each target worker's forward milliseconds a step; only where phases are
/// device time (events or sync timing): the host's wall time of a queued forward says nothing of
/// its rate.
fn target_rates(flops: f64, s: &Snapshot) -> Option<String> {
    if !matches!(s.gpu_timing?, GpuTiming::Events | GpuTiming::Sync) {
        return None;
    }
    let rates: Vec<String> = s
        .threads
        .iter()
        .filter(|t| t.role == Role::Target)
        .filter_map(|t| {
            let ms = t.w10.ms_per_step(Phase::Forward);
            (ms > 0.0).then(|| format!("{}={:.0}", t.name, flops / (ms / 1e3) / 1e12))
        })
        .collect();
    (!rates.is_empty()).then(|| {
        format!(
            "target forward TFLOP/s-equivalent ({:.1} TFLOP a batch): {}",
            flops / 1e12,
            rates.join(" ")
        )
    })
}

/// The drafter's rate per phase in TFLOP/s-equivalent (`engine::flops::drafter_flops` over each
/// phase's device time), per drafter worker.
fn drafter_rate_line(cfg: &PipelineSpec, s: &Snapshot) -> Option<String> {
    let f = crate::engine::flops::drafter_flops(&cfg.drafter_spec, cfg.seq_len, cfg.anchors);
    drafter_rates(f, cfg.batch as f64, s)
}

/// `f` a row x `rows` over each drafter worker's forward, loss and backward milliseconds a step,
/// and over the three together; only where phases are device time.
fn drafter_rates(f: DrafterFlops, rows: f64, s: &Snapshot) -> Option<String> {
    if !matches!(s.gpu_timing?, GpuTiming::Events | GpuTiming::Sync) {
        return None;
    }
    let parts = [
        ("forward", Phase::Forward, f.forward),
        ("loss", Phase::Loss, f.loss),
        ("backward", Phase::Backward, f.backward),
    ];
    let rate = |flops: f64, ms: f64| flops * rows / (ms / 1e3) / 1e12;
    let rates: Vec<String> = s
        .threads
        .iter()
        .filter(|t| t.role == Role::Drafter)
        .filter_map(|t| {
            let ms: Vec<f64> = parts.iter().map(|p| t.w10.ms_per_step(p.1)).collect();
            if ms.iter().any(|m| *m <= 0.0) {
                return None;
            }
            let each: Vec<String> = parts
                .iter()
                .zip(&ms)
                .map(|(p, m)| format!("{}={:.0}", p.0, rate(p.2, *m)))
                .collect();
            let all = rate(f.step(), ms.iter().sum());
            Some(format!("{} {} together={all:.0}", t.name, each.join(" ")))
        })
        .collect();
    (!rates.is_empty()).then(|| {
        format!(
            "drafter TFLOP/s-equivalent by phase ({:.1} TFLOP a batch: forward {:.1}, loss {:.1}, backward {:.1}): {}",
            f.step() * rows / 1e12,
            f.forward * rows / 1e12,
            f.loss * rows / 1e12,
            f.backward * rows / 1e12,
            rates.join("; ")
        )
    })
}

/// `bench drafter`: the drafter alone for --steps (default 20) timed steps on hidden states its
/// target computed first; each phase's device time and TFLOP/s-equivalent.
fn drafter(args: &BenchArgs) -> Result<()> {
    let cfg = RunConfig::from_args(&args.train)?.pipeline;
    let steps = args.train.steps.unwrap_or(20);
    let times = crate::engine::drafter_bench::run(&cfg, steps)?;
    let f = crate::engine::flops::drafter_flops(&cfg.drafter_spec, cfg.seq_len, cfg.anchors);
    let rows = cfg.batch as f64;
    println!(
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
    println!("bench: drafter ms a step: {}", phases.join(" "));
    let rate = |flops: f64, ms: f64| flops * rows / (ms / 1e3) / 1e12;
    let (fw, lo, bw) = (
        times.per_step(Phase::Forward),
        times.per_step(Phase::Loss),
        times.per_step(Phase::Backward),
    );
    println!(
        "bench: drafter TFLOP/s-equivalent alone ({:.1} TFLOP a batch): forward={:.0} loss={:.0} \
         backward={:.0} together={:.0}",
        f.step() * rows / 1e12,
        rate(f.forward, fw),
        rate(f.loss, lo),
        rate(f.backward, bw),
        rate(f.step(), fw + lo + bw)
    );
    Ok(())
}

/// Trains for --steps (default 60) without printing; reports throughput over the last 10 s and
/// per-thread phase times.
fn engine(args: &BenchArgs) -> Result<()> {
    let mut train = args.train.clone();
    train.steps = Some(train.steps.unwrap_or(60));
    let run = RunConfig::from_args(&train)?;
    let session = Session::start(&run)?;
    let cfg = &run.pipeline;
    let snapshots = session.telemetry.subscribe();
    let mut last = None;
    while !session.pipeline.is_finished() && !crate::signals::requested() {
        if let Ok(s) = snapshots.recv_timeout(Duration::from_millis(50)) {
            last = Some(s);
        }
    }
    let start_step = session.pipeline.start_step;
    session.finish()?;
    while let Ok(s) = snapshots.try_recv() {
        last = Some(s);
    }
    let Some(s) = last else {
        bail!("the run ended before any snapshot")
    };
    // Replicas step together: the run's rate is one replica's.
    let drafter_steps: f64 = s
        .threads
        .iter()
        .filter(|t| t.role == Role::Drafter)
        .map(|t| t.w10.steps_per_s())
        .fold(0.0, f64::max);
    println!(
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
        println!("bench: {}", phase_line(t));
    }
    println!("bench: {}", cuda_calls_line(cfg, &s));
    if let Some(line) = target_rate_line(cfg, &s) {
        println!("bench: {line}");
    }
    if let Some(line) = drafter_rate_line(cfg, &s) {
        println!("bench: {line}");
    }
    for line in memory_lines(cfg) {
        println!("bench: {line}");
    }
    // The run's own FLOP estimate rides in its snapshots (set at start).
    let gpus = crate::config::cuda_count() as usize;
    if let Some((advice, source)) = crate::telemetry::placement::for_run(&s, gpus) {
        println!(
            "bench: placement ({source}) {} ({})",
            advice.text(),
            advice.flags()
        );
    }
    println!(
        "bench: target_attention={} target_forward={} target_kernels={} drafter_step={} \
         adamw_bf16={} drafter_attention={}",
        crate::engine::varlen::attention_used(),
        crate::engine::target_graph::state(),
        crate::engine::cuda::target_kernels_state(),
        crate::engine::drafter_graph::state(),
        crate::engine::optim::bf16_kernel_state(),
        crate::engine::cuda::block_attention_state()
    );
    println!("{}", crate::headless::summary_line(&s, start_step));
    Ok(())
}

/// `bench replicas`: --steps (default 20) steps of the replicas on --drafter-devices against one
/// drafter with all their rows; fails unless the replicas end identical and the loss curves agree
/// within --tolerance at every step.
fn replicas(args: &BenchArgs) -> Result<()> {
    if !(args.tolerance > 0.0 && args.tolerance.is_finite()) {
        bail!("--tolerance must be a positive fraction (0.02 is 2%)");
    }
    let cfg = RunConfig::from_args(&args.train)?.pipeline;
    let steps = args.train.steps.unwrap_or(20);
    if let Some(job) = &cfg.job {
        return replicas_of_job(&cfg, job, steps, args.tolerance);
    }
    let report = crate::engine::replica_check::run(&cfg, steps)?;
    println!(
        "bench: replicas preset={} drafters={:?} (each {} rows) vs one drafter on {:?} ({} rows) \
         steps={steps}",
        cfg.preset.name,
        cfg.drafter_devices,
        cfg.batch,
        cfg.drafter_devices[0],
        cfg.batch * cfg.drafter_devices.len() as i64
    );
    for (i, (r, s)) in report.losses.iter().enumerate() {
        println!(
            "bench: step {} loss replicas={r:.4} single={s:.4} gap={:.3}%",
            i + 1,
            (r - s).abs() / s.abs().max(1e-6) * 100.0
        );
    }
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    println!(
        "bench: replicas identical after {steps} steps: {} (max |w0 - wN| = {:e})",
        if identical { "yes" } else { "no" },
        report.replica_diff
    );
    println!(
        "bench: loss gap, replicas' mean vs one drafter with all their rows: max {:.3}% over the \
         steps (tolerance {:.1}%); weights max |w0 - w_single| = {:.3e}",
        gap * 100.0,
        args.tolerance * 100.0,
        report.single_diff
    );
    if !identical || gap > args.tolerance {
        bail!(
            "the replica check failed: the replicas differ or their loss left the single drafter's"
        );
    }
    println!("bench: replica check passed");
    Ok(())
}

/// `bench replicas` as one rank of a job: this rank's replicas against rank 0's and against one
/// drafter with every replica's rows.
fn replicas_of_job(
    cfg: &PipelineSpec,
    job: &crate::job::JobTag,
    steps: u64,
    tolerance: f64,
) -> Result<()> {
    let report = crate::engine::replica_check::run(cfg, steps)?;
    let r = job.rank;
    let here = cfg.drafter_devices.len();
    println!(
        "bench: replicas rank {r} of {}, {here} here on {:?} (each {} rows) vs one drafter with \
         all {} rows steps={steps}",
        job.world,
        cfg.drafter_devices,
        cfg.batch,
        cfg.batch * job.world as i64 * here as i64
    );
    for (i, (m, s)) in report.losses.iter().enumerate() {
        println!(
            "bench: rank {r} step {} loss replicas={m:.4} single={s:.4} gap={:.3}%",
            i + 1,
            (m - s).abs() / s.abs().max(1e-6) * 100.0
        );
    }
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    println!(
        "bench: rank {r} identical to rank 0 after {steps} steps: {} (max |w0 - w{r}| = {:e}); \
         loss gap max {:.3}% (tolerance {:.1}%); max |w{r} - w_single| = {:.3e}",
        if identical { "yes" } else { "no" },
        report.replica_diff,
        gap * 100.0,
        tolerance * 100.0,
        report.single_diff
    );
    if !identical || gap > tolerance {
        bail!("the replica check failed on rank {r}: the replicas differ or their loss left the single drafter's");
    }
    println!("bench: replica check passed on rank {r}");
    Ok(())
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
            let peak = crate::engine::cuda::memory_peak(i, false).ok()?;
            Some(format!(
                "memory cuda:{i} peak_allocated_gib={:.2}",
                peak as f64 / (1u64 << 30) as f64
            ))
        })
        .collect()
}

struct Setting {
    name: &'static str,
    command: HubCommand,
}

/// The snapshots published during the next `d` (or until the run ends).
fn snapshots_for(
    rx: &Receiver<Arc<Snapshot>>,
    d: Duration,
    session: &Session,
) -> Vec<Arc<Snapshot>> {
    let end = Instant::now() + d;
    let mut out = Vec::new();
    while Instant::now() < end && !session.pipeline.is_finished() && !crate::signals::requested() {
        if let Ok(s) = rx.recv_timeout(Duration::from_millis(50)) {
            out.push(s);
        }
    }
    out.extend(rx.try_iter());
    out
}

/// Runs the settings in turn, `--segment` seconds each, `--rounds` times after a warm-up turn;
/// reports tok/s per setting — the mean of the 1 s tok/s (steps in progress prorated, so not
/// quantised to whole steps) over each segment less its first second, whose window still holds
/// the previous setting — with its ratio to the first setting, and each thread's phase times in
/// the setting's last segment.
fn alternate(args: &BenchArgs, settings: &[Setting]) -> Result<()> {
    if !(args.segment >= 2.0 && args.segment.is_finite()) {
        bail!("--segment must be at least 2 seconds");
    }
    if args.rounds == 0 {
        bail!("--rounds 0 measures nothing (the first turn is a warm-up): give 1 or more");
    }
    let mut train = args.train.clone();
    train.steps = None;
    let run = RunConfig::from_args(&train)?;
    let session = Session::start(&run)?;
    let cfg = &run.pipeline;
    let rx = session.telemetry.subscribe();
    let settle = Duration::from_secs(1);
    let measure = Duration::from_secs_f64(args.segment - 1.0);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    let mut last: Vec<Option<Arc<Snapshot>>> = vec![None; settings.len()];
    for round in 0..=args.rounds {
        for (i, s) in settings.iter().enumerate() {
            session.telemetry.command(s.command.clone());
            snapshots_for(&rx, settle, &session);
            let measured = snapshots_for(&rx, measure, &session);
            if crate::signals::requested() {
                session.finish()?;
                bail!("stopped by a signal: the benchmark is incomplete, nothing to report");
            }
            if measured.is_empty() {
                bail!(
                    "the run ended during the benchmark: {}",
                    session
                        .pipeline
                        .first_error()
                        .unwrap_or_else(|| "no error was reported".into())
                );
            }
            if round > 0 {
                rates[i].extend(measured.iter().map(|s| s.train.tok_per_s_1s));
                last[i] = measured.last().cloned();
            }
        }
    }
    session.finish()?;
    let rate = |i: usize| rates[i].iter().sum::<f64>() / rates[i].len().max(1) as f64;
    println!(
        "bench: preset={} devices target={:?} drafter={:?} rounds={} segment={}s",
        cfg.preset.name, cfg.target_devices, cfg.drafter_devices, args.rounds, args.segment
    );
    for (i, s) in settings.iter().enumerate() {
        println!(
            "bench: {} tok/s={:.0} ratio={:.4} (vs {})",
            s.name,
            rate(i),
            rate(i) / rate(0).max(1e-9),
            settings[0].name
        );
        if let Some(snap) = &last[i] {
            for t in &snap.threads {
                println!("bench: {} {}", s.name, phase_line(t));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::snapshot::{PhaseWindow, ThreadState};

    fn worker(name: &str, role: Role, forward_ms: u64) -> ThreadView {
        let mut w10 = PhaseWindow {
            steps: 2,
            wall_ns: 400_000_000,
            phase_steps: 2.0,
            ..Default::default()
        };
        w10.phase_ns[Phase::Forward.index()] = 2 * forward_ms * 1_000_000;
        ThreadView {
            name: name.into(),
            role,
            device: "cuda:0".into(),
            tid: 1,
            cpu_pct: None,
            phase: Phase::Forward,
            phase_s: 0.0,
            state: ThreadState::Working,
            os_state: None,
            w1: Default::default(),
            w10,
            run: Default::default(),
            sizes: None,
        }
    }

    #[test]
    fn the_target_rate_is_its_flops_over_the_forwards_device_time() {
        let mut s = Snapshot {
            threads: vec![
                worker("target-0", Role::Target, 100),
                worker("target-1", Role::Target, 50),
                worker("drafter-0", Role::Drafter, 80),
            ],
            gpu_timing: Some(GpuTiming::Events),
            ..Default::default()
        };
        // 43 TFLOP a batch in 100 ms and in 50 ms a step: 430 and 860; the drafter is not a target.
        assert_eq!(
            target_rates(43e12, &s).as_deref(),
            Some(
                "target forward TFLOP/s-equivalent (43.0 TFLOP a batch): target-0=430 target-1=860"
            )
        );
        // Host wall time (async, or the CPU) says nothing of a queued forward's rate.
        s.gpu_timing = Some(GpuTiming::Async);
        assert_eq!(target_rates(43e12, &s), None);
        s.gpu_timing = None;
        assert_eq!(target_rates(43e12, &s), None);
    }

    #[test]
    fn the_drafter_rate_is_each_phases_flops_over_its_device_time() {
        let mut d = worker("drafter-0", Role::Drafter, 20);
        d.w10.phase_ns[Phase::Loss.index()] = 2 * 10_000_000;
        d.w10.phase_ns[Phase::Backward.index()] = 2 * 40_000_000;
        let mut s = Snapshot {
            threads: vec![worker("target-0", Role::Target, 100), d],
            gpu_timing: Some(GpuTiming::Events),
            ..Default::default()
        };
        let f = DrafterFlops {
            forward: 5e12,
            loss: 3e12,
            backward: 10e12,
        };
        // Two rows: 10 TFLOP in 20 ms, 6 in 10 ms, 20 in 40 ms; 36 in 70 ms together.
        assert_eq!(
            drafter_rates(f, 2.0, &s).as_deref(),
            Some(
                "drafter TFLOP/s-equivalent by phase (36.0 TFLOP a batch: forward 10.0, loss 6.0, \
                 backward 20.0): drafter-0 forward=500 loss=600 backward=500 together=514"
            )
        );
        s.gpu_timing = Some(GpuTiming::Async);
        assert_eq!(drafter_rates(f, 2.0, &s), None);
    }
}
