//! `bench engine`'s lines about each thread: its phases, the CUDA calls, and the target's and the
//! drafter's FLOP rates over their phases' device time.

use crate::engine::model::flops::DrafterFlops;
use crate::engine::spec::PipelineSpec;
use crate::telemetry::snapshot::ThreadView;
use crate::telemetry::{GpuTiming, Phase, Role, Snapshot};

pub(super) fn phase_line(t: &ThreadView) -> String {
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
pub(super) fn cuda_calls_line(cfg: &PipelineSpec, s: &Snapshot) -> String {
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
/// phase's device time, a row's attention counted as one document's: an upper bound), per target
/// worker.
pub(super) fn target_rate_line(cfg: &PipelineSpec, s: &Snapshot) -> Option<String> {
    let flops = crate::engine::model::flops::target_flops(
        &cfg.target_config,
        &cfg.drafter_spec,
        cfg.seq_len,
        None,
    ) * cfg.batch as f64;
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
/// phase's device time, a row counted as one document: an upper bound), per drafter worker. A
/// batch trained in N steps gives each step the row's context and an N-th of its anchors; with a
/// step a document each step's share varies, and the line says so instead.
pub(super) fn drafter_rate_line(cfg: &PipelineSpec, s: &Snapshot) -> Option<String> {
    if cfg.steps_per_batch == crate::engine::train::recipe::STEP_PER_DOC {
        return Some(
            "drafter TFLOP/s-equivalent: n/a with a step a document (each step's share of the \
             batch differs)"
                .into(),
        );
    }
    // Each of the N steps: the row's context, an N-th of its anchors.
    let f = crate::engine::model::flops::drafter_flops(
        &cfg.drafter_spec,
        cfg.seq_len,
        (cfg.anchors / cfg.steps_per_batch.max(1)).max(1),
        None,
    );
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
