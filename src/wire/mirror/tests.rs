//! Tests of the mirror, a local hub fed by a session's socket (src/wire/mirror.rs).

use super::*;
use crate::cancel::CancelToken;
use crate::telemetry::snapshot::{GpuPanel, GpuView};
use crate::telemetry::switches::GpuTiming;
use crate::telemetry::Snapshot;
use crossbeam_channel::Receiver;
use std::time::{Duration, Instant};

fn sample(now: u64) -> Msg {
    sample_with(now, Vec::new())
}

fn sample_with(now: u64, alloc: Vec<WireAlloc>) -> Msg {
    Msg::Sample(Sample {
        now,
        prof: true,
        timing: GpuTiming::Async,
        paused: false,
        dropped: 0,
        live: Vec::new(),
        q: Vec::new(),
        alloc,
        gpu: Vec::new(),
    })
}

fn hello() -> Hello {
    Hello {
        pid: 1,
        program: "dflash-top".into(),
        now_ns: 5,
        ns_per_mark: 10.0,
        stages: StageTable::builtin(),
        can_save: false,
        config: None,
        job: None,
        cupti: None,
        host: None,
    }
}

#[test]
fn another_hosts_clock_is_moved_onto_ours_by_its_first_sample() {
    let hello = hello();
    let telemetry = Telemetry::new();
    let mut m = Mirror::new(&hello, &telemetry, 0).unwrap();
    m.on_other_host("far");
    // That host booted long after this one: its clock reads one second now.
    let theirs = 1_000_000_000u64;
    m.apply(sample(theirs));
    let here = clock::now_ns();
    let moved = m.local(theirs + 500_000_000);
    let ahead = moved as i128 - here as i128;
    assert!(
        (400_000_000..=600_000_000).contains(&ahead),
        "half a second after their sample is about half a second from now here: {ahead} ns"
    );
}

/// A viewer's hub (no probes of its own) with a mirror of a producer whose drafter thread
/// is on cuda:0.
fn watched() -> (Telemetry, Mirror, Receiver<Arc<Snapshot>>, CancelToken) {
    let mut telemetry = Telemetry::new();
    telemetry.probes = false;
    let snaps = telemetry.subscribe();
    let mut m = Mirror::new(&hello(), &telemetry, 0).unwrap();
    m.apply(Msg::Thread(ThreadDecl {
        id: 0,
        name: "drafter-0".into(),
        stage: "drafter".into(),
        device: "cuda:0".into(),
        tid: 1,
    }));
    (telemetry, m, snaps, CancelToken::new())
}

/// The first snapshot of `snaps` that `want` holds for, within 5 s.
fn wait_for(snaps: &Receiver<Arc<Snapshot>>, want: impl Fn(&Snapshot) -> bool) -> Arc<Snapshot> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(s) = snaps.recv_timeout(Duration::from_millis(200)) {
            if want(&s) {
                return s;
            }
        }
    }
    panic!("no such snapshot within 5 s");
}

fn cuda0(allocs: u64, frees: u64, retries: u64) -> WireAlloc {
    WireAlloc {
        cuda: 0,
        reserved: 13 << 30,
        allocated: 3 << 30,
        segments: 42,
        allocs,
        frees,
        retries,
        graphs: 0,
    }
}

/// Issue 28: the allocator figures in a watched process's samples reach the attached view's
/// snapshots (rated over its samples' own times), and `alloc_churn` judges them.
#[test]
fn a_watched_processs_allocator_figures_reach_its_snapshots_and_warnings() {
    let (telemetry, mut m, snaps, cancel) = watched();
    let hub = telemetry.spawn_hub(cancel.clone()).unwrap();
    let t0 = clock::to_monotonic(clock::now_ns());
    m.apply(sample_with(t0, vec![cuda0(100, 90, 0)]));
    let first = wait_for(&snaps, |s| !s.allocator.is_empty());
    let a = &first.allocator[0];
    assert_eq!(
        (a.cuda, a.reserved_bytes, a.allocated_bytes, a.segments),
        (0, 13 << 30, 3 << 30, 42)
    );
    assert_eq!(
        (a.device_allocs, a.device_frees, a.alloc_retries),
        (100, 90, 0)
    );
    assert_eq!((a.churn_per_s, a.retries_per_s), (0.0, 0.0));
    // One second later by the producer's clock: 50 allocations and frees, 2 retries.
    m.apply(sample_with(t0 + 1_000_000_000, vec![cuda0(130, 110, 2)]));
    let second = wait_for(&snaps, |s| s.allocator.iter().any(|a| a.alloc_retries == 2));
    let a = &second.allocator[0];
    assert!((a.churn_per_s - 50.0).abs() < 1e-9, "{a:?}");
    assert!((a.retries_per_s - 2.0).abs() < 1e-9, "{a:?}");
    let warned = wait_for(&snaps, |s| {
        s.warnings.iter().any(|w| w.key() == "alloc_churn:cuda:0")
    });
    assert!(!warned.allocator.is_empty());
    // A sample without figures (the producer stopped reading them): none shown.
    m.apply(sample(t0 + 2_000_000_000));
    wait_for(&snaps, |s| s.allocator.is_empty());
    cancel.cancel();
    hub.join().unwrap();
}

/// Issue 30: a session on another host sends its GPUs in its samples: the attached view
/// shows them (and its allocator) under that host's name, its util history growing with
/// each reading; a session on this host has its GPUs read here, not taken from the wire.
#[test]
fn another_hosts_gpus_reach_the_view_under_its_name() {
    let gpu = |util: u32| WireGpu {
        index: 0,
        cuda: Some(0),
        name: "NVIDIA H200".into(),
        util,
        used: 9_000,
        total: 143_771,
        ..WireGpu::default()
    };
    let with_gpu = |now: u64, util: u32| match sample_with(now, vec![cuda0(1, 1, 0)]) {
        Msg::Sample(s) => Msg::Sample(Sample {
            gpu: vec![gpu(util)],
            ..s
        }),
        _ => unreachable!(),
    };
    let (telemetry, mut m, snaps, cancel) = watched();
    m.on_other_host("far");
    let hub = telemetry.spawn_hub(cancel.clone()).unwrap();
    let t0 = 1_000_000_000;
    let shown = |s: &Snapshot| matches!(&s.gpus, GpuPanel::Present(_));
    m.apply(with_gpu(t0, 40));
    wait_for(&snaps, shown);
    m.apply(sample(t0 + 100_000_000));
    m.apply(with_gpu(t0 + 1_000_000_000, 95));
    let s = wait_for(&snaps, |s| match &s.gpus {
        GpuPanel::Present(g) => g[0].util_history.len() == 2,
        GpuPanel::Absent(_) => false,
    });
    let GpuPanel::Present(g) = &s.gpus else {
        unreachable!()
    };
    assert_eq!(g.len(), 1);
    assert_eq!(
        (g[0].host.as_deref(), g[0].cuda, g[0].util_pct),
        (Some("far"), Some(0), 95)
    );
    assert_eq!(g[0].util_history, [40, 95]);
    assert_eq!(s.allocator[0].host.as_deref(), Some("far"));
    cancel.cancel();
    hub.join().unwrap();
    // On this host: the wire's GPUs are not shown (NVML here reads them, or says why not).
    let (telemetry, mut m, snaps, cancel) = watched();
    let hub = telemetry.spawn_hub(cancel.clone()).unwrap();
    m.apply(with_gpu(t0, 40));
    let s = wait_for(&snaps, |s| !s.allocator.is_empty());
    let from_wire = |g: &[GpuView]| g.iter().any(|g| g.util_pct == 40);
    assert!(
        matches!(&s.gpus, GpuPanel::Absent(_))
            || !matches!(&s.gpus, GpuPanel::Present(g) if from_wire(g)),
        "{:?}",
        s.gpus
    );
    assert_eq!(s.allocator[0].host, None);
    cancel.cancel();
    hub.join().unwrap();
}

/// A producer that sends no allocator figures (an older peer, the CPU) shows none: no
/// made-up zeros.
#[test]
fn a_producer_without_allocator_figures_shows_none() {
    let (telemetry, mut m, snaps, cancel) = watched();
    let t0 = clock::to_monotonic(clock::now_ns());
    for k in 0..3 {
        m.apply(sample(t0 + k * 100_000_000));
    }
    // Every snapshot comes after the samples: none has allocator views.
    let hub = telemetry.spawn_hub(cancel.clone()).unwrap();
    for _ in 0..3 {
        let s = wait_for(&snaps, |s| !s.threads.is_empty());
        assert!(s.allocator.is_empty(), "{:?}", s.allocator);
    }
    cancel.cancel();
    hub.join().unwrap();
}
