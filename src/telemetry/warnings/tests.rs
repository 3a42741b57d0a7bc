//! Each rule on scripted snapshots: one sequence that triggers it, one that must not.

use super::*;
use crate::telemetry::snapshot::{
    AllocatorView, GpuPanel, GpuView, PhaseWindow, QueueView, SelfCost, ThreadState, ThreadView,
};
use crate::telemetry::{Phase, Role};

fn thread(name: &str, role: Role, device: &str, phase: Phase) -> ThreadView {
    ThreadView {
        name: name.into(),
        role,
        device: device.into(),
        tid: 0,
        cpu_pct: None,
        phase,
        phase_s: 0.5,
        state: ThreadState::Working,
        os_state: None,
        w1: PhaseWindow::default(),
        w10: PhaseWindow::default(),
        run: PhaseWindow::default(),
        sizes: None,
    }
}

fn queue(name: &str, producers: &str, consumers: &str, capacity: usize) -> QueueView {
    QueueView {
        name: name.into(),
        producers: producers.into(),
        consumers: consumers.into(),
        capacity,
        depth: 1,
        min_depth: 1,
        max_depth: 1,
        ..QueueView::default()
    }
}

/// Our pipeline on the CPU: loader -> batch -> target-0 -> hs -> drafter-0, nothing waiting.
fn base(t: f64) -> Snapshot {
    Snapshot {
        elapsed_s: t,
        profiling: true,
        threads: vec![
            thread("loader", Role::Loader, "cpu", Phase::Pack),
            thread("target-0", Role::Target, "cpu", Phase::Forward),
            thread("drafter-0", Role::Drafter, "cpu", Phase::Forward),
        ],
        queues: vec![
            queue("batch", "loader", "target", 4),
            queue("hs", "target", "drafter", 2),
        ],
        self_cost: SelfCost {
            marks_per_s: 300.0,
            ns_per_mark: 40.0,
            snapshot_us: 50.0,
            ..SelfCost::default()
        },
        ..Snapshot::default()
    }
}

/// Runs the rules over 0.5 s ticks from 0 to `until` s, `edit` scripting each snapshot; returns
/// the warnings at the last one.
fn run(config: WarnConfig, until: f64, edit: impl Fn(&mut Snapshot)) -> Vec<Warning> {
    let mut w = Warnings::new(config);
    let mut last = Vec::new();
    let mut t = 0.0;
    while t <= until + 1e-9 {
        let mut s = base(t);
        edit(&mut s);
        last = w.check(&s);
        t += 0.5;
    }
    last
}

fn keys(w: &[Warning]) -> Vec<String> {
    w.iter().map(Warning::key).collect()
}

#[test]
fn a_healthy_run_has_no_warnings() {
    assert!(run(WarnConfig::default(), 60.0, |_| {}).is_empty());
}

#[test]
fn starved_after_its_hold_naming_the_queue_its_depth_and_the_other_side() {
    let starve = |s: &mut Snapshot| {
        s.queues[1].consumer_wait_share = 0.8;
        s.queues[1].depth = 0;
    };
    // Not yet held for 10 s.
    assert!(run(WarnConfig::default(), 9.0, starve).is_empty());
    let w = run(WarnConfig::default(), 12.0, starve);
    assert_eq!(keys(&w), ["starved:drafter"]);
    assert_eq!(w[0].severity, Severity::Warn);
    assert!(w[0].for_s >= 10.0);
    for m in ["`hs`", "80%", "depth 0/2", "target-0 in forward"] {
        assert!(w[0].evidence.contains(m), "no {m} in {}", w[0].evidence);
    }
    assert!(
        w[0].fix.contains("target side is the bottleneck"),
        "{}",
        w[0].fix
    );
    // Below the share: nothing; an interruption restarts the hold.
    let below = |s: &mut Snapshot| s.queues[1].consumer_wait_share = 0.2;
    assert!(run(WarnConfig::default(), 30.0, below).is_empty());
    let gap = |s: &mut Snapshot| {
        if s.elapsed_s != 8.0 {
            starve(s)
        }
    };
    assert!(run(WarnConfig::default(), 17.0, gap).is_empty());
}

#[test]
fn blocked_only_on_the_last_queue() {
    let cfg = WarnConfig {
        blocked_s: 5.0,
        ..WarnConfig::default()
    };
    let w = run(cfg.clone(), 6.0, |s| s.queues[1].producer_wait_share = 0.9);
    assert_eq!(keys(&w), ["blocked:target"]);
    assert_eq!(w[0].severity, Severity::Info);
    assert!(
        w[0].evidence.contains("drafter-0 in forward"),
        "{}",
        w[0].evidence
    );
    // The loader waiting on a full batch queue is prefetching.
    assert!(run(cfg, 60.0, |s| s.queues[0].producer_wait_share = 0.9).is_empty());
}

#[test]
fn stalled_is_an_error_naming_the_thread() {
    let w = run(WarnConfig::default(), 1.0, |s| {
        s.stall = Some("target-0 in forward for 12.0 s".into());
        // Waiting while stalled is the stall's doing, not starvation.
        s.queues[1].consumer_wait_share = 1.0;
    });
    assert_eq!(keys(&w), ["stalled:target-0"]);
    assert_eq!(w[0].severity, Severity::Error);
    assert!(w[0].evidence.contains("for 12.0 s"));
    assert!(run(WarnConfig::default(), 30.0, |s| s.stall = None).is_empty());
}

fn gpu(util: u32) -> GpuPanel {
    GpuPanel::Present(vec![GpuView {
        index: 0,
        name: "H200".into(),
        util_pct: util,
        mem_used_mib: 0,
        mem_total_mib: 0,
        power_w: 0.0,
        sm_clock_mhz: 0,
        temp_c: 0,
        util_history: vec![],
        cuda: Some(0),
        mem_bw_pct: 0,
        proc_mem_mib: None,
        throttle: vec![],
        host: None,
    }])
}

#[test]
fn gpu_idle_while_work_is_queued_but_not_without_gpus_or_work() {
    let on_gpu = |util: u32, depth: usize| {
        move |s: &mut Snapshot| {
            s.threads[2].device = "cuda:0".into();
            s.threads[2].run.steps = WARMUP_STEPS;
            s.queues[1].depth = depth;
            s.gpus = gpu(util);
        }
    };
    let w = run(WarnConfig::default(), 11.0, on_gpu(3, 2));
    assert_eq!(keys(&w), ["gpu_idle:cuda:0"]);
    assert!(
        w[0].evidence.contains("3% utilisation"),
        "{}",
        w[0].evidence
    );
    assert!(w[0].evidence.contains("drafter-0"), "{}", w[0].evidence);
    // Busy, or nothing queued, or no GPU at all: silent.
    assert!(run(WarnConfig::default(), 30.0, on_gpu(90, 2)).is_empty());
    assert!(run(WarnConfig::default(), 30.0, on_gpu(3, 0)).is_empty());
    assert!(run(WarnConfig::default(), 30.0, |s| s.queues[1].depth = 2).is_empty());
    // Start-up: the window opens when every worker on the GPU is past its warm-up steps
    // (before, models load, kernels build and graphs are captured with batches queued). The
    // drafter ends a step a second from 1 s: its warm-up ends at 5 s.
    let warm_at_5s = |s: &mut Snapshot| {
        on_gpu(3, 2)(s);
        s.threads[2].run.steps = s.elapsed_s as u64;
    };
    assert!(run(WarnConfig::default(), 14.5, warm_at_5s).is_empty());
    assert_eq!(
        keys(&run(WarnConfig::default(), 15.0, warm_at_5s)),
        ["gpu_idle:cuda:0"]
    );
}

/// Found on the H200: a drafter sleeping 0.5 s a step read 0, 0, 49, 0, 10 … percent, and the
/// rule never fired, each spike starting its wait over. It judges the window's mean.
#[test]
fn gpu_idle_judges_the_mean_utilisation_so_that_spikes_do_not_hide_an_idle_gpu() {
    // Every `every`-th tick (half a second apart) reads `peak`, the others 0.
    let spiky = |peak: u32, every: u64| {
        move |s: &mut Snapshot| {
            s.threads[2].device = "cuda:0".into();
            s.threads[2].run.steps = WARMUP_STEPS;
            s.queues[1].depth = 2;
            let tick = (s.elapsed_s * 2.0).round() as u64;
            s.gpus = gpu(if tick.is_multiple_of(every) { peak } else { 0 });
        }
    };
    // At 11 s the window holds the 21 samples from 1 s on, 4 of them at 49%.
    let w = run(WarnConfig::default(), 11.0, spiky(49, 5));
    assert_eq!(keys(&w), ["gpu_idle:cuda:0"]);
    assert!(
        w[0].evidence
            .contains("9% utilisation on average over 10 s"),
        "{}",
        w[0].evidence
    );
    // Not before the window is covered, and not when the mean is above the threshold.
    assert!(run(WarnConfig::default(), 9.5, spiky(49, 5)).is_empty());
    assert!(run(WarnConfig::default(), 30.0, spiky(100, 2)).is_empty());
}

/// Every thread of `s` past its warm-up steps (the `queue_jitter` window is open).
fn warmed(s: &mut Snapshot) {
    for t in &mut s.threads {
        t.run.steps = WARMUP_STEPS + (s.elapsed_s * 2.0) as u64;
    }
}

#[test]
fn a_queue_that_runs_empty_and_full_within_the_window_is_too_small() {
    // The target works in bursts: for 2 s of every 4 hs runs empty (the drafter waits a third
    // of its time), for the other 2 full (the target waits a third of its time).
    let jitter = |s: &mut Snapshot| {
        warmed(s);
        let q = &mut s.queues[1];
        if ((s.elapsed_s / 2.0) as u64).is_multiple_of(2) {
            q.min_depth = 0;
            q.consumer_wait_share = 0.3;
        } else {
            q.max_depth = 2;
            q.producer_wait_share = 0.3;
        }
    };
    let w = run(WarnConfig::default(), 20.0, jitter);
    assert_eq!(keys(&w), ["queue_jitter:hs"]);
    assert!(
        w[0].fix.contains("`hs_queue`") && w[0].fix.contains(" 4"),
        "{}",
        w[0].fix
    );
    assert!(
        w[0].evidence
            .contains("ran empty and full within 10 s, its drafter waiting 1")
            && w[0].evidence.contains("% and its target 1"),
        "{}",
        w[0].evidence
    );
    // Empty and full, half a second each, 2 s apart: within the default window, not within one
    // of a second.
    let apart = |s: &mut Snapshot| {
        warmed(s);
        let q = &mut s.queues[1];
        match (s.elapsed_s * 2.0) as u64 % 8 {
            0 => (q.min_depth, q.consumer_wait_share) = (0, 0.9),
            4 => (q.max_depth, q.producer_wait_share) = (2, 0.9),
            _ => {}
        }
    };
    assert_eq!(
        keys(&run(WarnConfig::default(), 20.0, apart)),
        ["queue_jitter:hs"]
    );
    let cfg = WarnConfig {
        jitter_window_s: 1.0,
        ..WarnConfig::default()
    };
    assert!(run(cfg, 20.0, apart).is_empty());
    // Touching empty and full without anyone waiting costs nothing.
    let free = |s: &mut Snapshot| {
        warmed(s);
        s.queues[1].min_depth = 0;
        s.queues[1].max_depth = 2;
    };
    assert!(run(WarnConfig::default(), 20.0, free).is_empty());
}

#[test]
fn no_queue_jitter_at_start_up_or_from_one_hiccup_of_a_busy_host() {
    // What a healthy drafter-bound run on a loaded host looked like (issue 44): the target
    // always waits on the full hs queue; at start the drafter waited on it empty (the target's
    // first step), and once, a second long, the target was descheduled and the drafter waited
    // 46% of that second.
    let healthy = |s: &mut Snapshot| {
        let t = s.elapsed_s;
        for th in &mut s.threads {
            th.run.steps = (t * 3.0) as u64;
        }
        let q = &mut s.queues[1];
        q.max_depth = 2;
        q.producer_wait_share = 0.9;
        if t < 1.5 || (30.0..31.0).contains(&t) {
            q.min_depth = 0;
            q.consumer_wait_share = if t < 1.5 { 0.9 } else { 0.46 };
        }
    };
    let jitter = |w: Vec<Warning>| -> Vec<String> {
        keys(&w)
            .into_iter()
            .filter(|k| k.starts_with("queue_jitter"))
            .collect()
    };
    for until in [3.0, 8.0, 12.0, 31.0, 35.0, 45.0] {
        let w = run(WarnConfig::default(), until, healthy);
        assert!(jitter(w).is_empty(), "at {until} s");
    }
    // The same start with the warm-up not excluded would have warned (the window is open).
    let early = |s: &mut Snapshot| {
        healthy(s);
        warmed(s);
    };
    let w = run(WarnConfig::default(), 10.0, early);
    assert_eq!(jitter(w), ["queue_jitter:hs"]);
}

#[test]
fn profiling_over_its_budget_and_not_when_off() {
    let costly = |s: &mut Snapshot| {
        s.self_cost.marks_per_s = 3e6;
        s.self_cost.ns_per_mark = 50.0;
    };
    let w = run(WarnConfig::default(), 6.0, costly);
    assert_eq!(keys(&w), ["profiling_cost:marks"]);
    assert!(
        w[0].evidence.contains("5.0% of each worker"),
        "{}",
        w[0].evidence
    );
    assert!(run(WarnConfig::default(), 6.0, |s| {
        costly(s);
        s.profiling = false;
    })
    .is_empty());
    let w = run(WarnConfig::default(), 6.0, |s| {
        s.self_cost.snapshot_us = 5_000.0
    });
    assert_eq!(keys(&w), ["profiling_cost:hub"]);
}

#[test]
fn dropped_records_warn_for_a_window_after_the_drop() {
    let drop_at_5 = |s: &mut Snapshot| {
        s.self_cost.dropped = if s.elapsed_s >= 5.0 { 12 } else { 0 };
    };
    let w = run(WarnConfig::default(), 10.0, drop_at_5);
    assert_eq!(keys(&w), ["dropped:records"]);
    assert!(
        w[0].evidence.starts_with("12 step records dropped"),
        "{}",
        w[0].evidence
    );
    // Ten seconds later with no new drop: gone.
    assert!(run(WarnConfig::default(), 16.0, drop_at_5).is_empty());
    // A steady zero never warns.
    assert!(run(WarnConfig::default(), 30.0, |s| s.self_cost.dropped = 0).is_empty());
}

#[test]
fn host_syncs_over_their_share_where_the_producer_counts_them() {
    // A producer that counts its syncs (here the drafter's grad_sync stands in for a Python
    // pipeline's declared `sync` phase): 25% of its time in 12 syncs a step.
    let syncing = |n: f64| {
        move |s: &mut Snapshot| {
            let w = &mut s.threads[2].w10;
            w.wall_ns = 1_000_000_000;
            w.phase_steps = 10.0;
            w.phase_ns[Phase::GradSync.index()] = 250_000_000;
            w.phase_n[Phase::GradSync.index()] = n;
        }
    };
    let run_sync = |until: f64, edit: &dyn Fn(&mut Snapshot)| {
        let mut w = Warnings::new(WarnConfig::default());
        w.is_sync = |p| p == Phase::GradSync;
        let mut last = Vec::new();
        for k in 0..=(until * 2.0) as u64 {
            let mut s = base(k as f64 * 0.5);
            edit(&mut s);
            last = w.check(&s);
        }
        last
    };
    let w = run_sync(11.0, &syncing(120.0));
    assert_eq!(keys(&w), ["host_sync:drafter-0"]);
    assert!(
        w[0].evidence
            .contains("25% of its time in host syncs, 12.0 a step"),
        "{}",
        w[0].evidence
    );
    assert!(w[0].fix.contains("each .item()"), "{}", w[0].fix);
    // Where its sites are known, the evidence names the costliest and the fix its line.
    let with_site = |s: &mut Snapshot| {
        syncing(120.0)(s);
        s.sync_sites = vec![crate::telemetry::snapshot::SyncSite {
            thread: "drafter-0".into(),
            at: "train.py:42".into(),
            op: ".item()".into(),
            count: 100,
            ns: 200_000_000,
            steps: 10,
        }];
    };
    let w = run_sync(11.0, &with_site);
    assert!(
        w[0].evidence
            .ends_with("the costliest site: train.py:42 .item() x10.0 20.0ms"),
        "{}",
        w[0].evidence
    );
    assert!(
        w[0].fix
            .starts_with(".item() waits for the GPU at train.py:42"),
        "{}",
        w[0].fix
    );
    // Not counted (our own workers, or a producer without the counts): silent.
    assert!(run_sync(30.0, &syncing(0.0)).is_empty());
    // The default: only a phase named `sync` counts.
    assert!(run(WarnConfig::default(), 30.0, syncing(120.0)).is_empty());
}

/// Issue 28: our engine counts its reads of the device back per phase; a thread on a GPU over
/// the budget a step is warned about, naming the phases, most first.
#[test]
fn counted_host_syncs_over_the_budget_a_step_on_a_gpu() {
    // Ten steps in the 10 s window, `loss` and `metrics` reads in all; on `device`.
    let reads = |device: &'static str, loss: u64, metrics: u64| {
        move |s: &mut Snapshot| {
            let t = &mut s.threads[2];
            t.device = device.into();
            t.w10.steps = 10;
            t.w10.host_syncs[Phase::Loss.index()] = loss;
            t.w10.host_syncs[Phase::Metrics.index()] = metrics;
        }
    };
    let w = run(WarnConfig::default(), 11.0, reads("cuda:0", 50, 10));
    assert_eq!(keys(&w), ["host_sync:drafter-0"]);
    for m in [
        "6.0 times a step",
        "5.0 in loss, 1.0 in metrics",
        "budget of 2",
    ] {
        assert!(w[0].evidence.contains(m), "no {m} in {}", w[0].evidence);
    }
    assert!(w[0].fix.starts_with("keep loss's numbers"), "{}", w[0].fix);
    // Held for its time first.
    assert!(run(WarnConfig::default(), 9.0, reads("cuda:0", 50, 10)).is_empty());
    // Our engine's one read a step: silent; so is the same code on the CPU (nothing to wait for).
    assert!(run(WarnConfig::default(), 30.0, reads("cuda:0", 0, 10)).is_empty());
    assert!(run(WarnConfig::default(), 30.0, reads("cpu", 50, 10)).is_empty());
    // The budget is the TOML's.
    let cfg = WarnConfig {
        host_syncs_per_step: 8.0,
        ..WarnConfig::default()
    };
    assert!(run(cfg, 30.0, reads("cuda:0", 50, 10)).is_empty());
}

#[test]
fn rules_can_be_switched_off_and_their_severity_replaced() {
    let starve = |s: &mut Snapshot| s.queues[1].consumer_wait_share = 0.8;
    let cfg = WarnConfig {
        off: vec!["starved".into()],
        ..WarnConfig::default()
    };
    assert!(run(cfg, 20.0, starve).is_empty());
    let mut cfg = WarnConfig::default();
    cfg.severity.insert("starved".into(), "error".into());
    let w = run(cfg, 20.0, starve);
    assert_eq!(w[0].severity, Severity::Error);
    assert_eq!(counts(&w), (1, 0, 0));
}

mod alloc;
mod shapes;
