//! Tests of merging several sessions' snapshots into one view (src/wire/merge.rs).

use super::*;
use crate::telemetry::snapshot::{QueueView, ThreadState, ThreadView};
use crate::telemetry::verdict::Verdict;
use crate::telemetry::{Phase, Role};

fn rank(tok_per_s: f64, step: u64, verdict: Verdict) -> Snapshot {
    let thread = |name: &str, role| ThreadView {
        name: name.into(),
        role,
        device: "cpu".into(),
        tid: 1,
        cpu_pct: Some(10.0),
        phase: Phase::Forward,
        phase_s: 0.1,
        state: ThreadState::Working,
        os_state: Some('R'),
        w1: Default::default(),
        w10: Default::default(),
        run: Default::default(),
        sizes: None,
    };
    Snapshot {
        train: TrainView {
            step,
            loss: Some(2.0 + step as f32 / 100.0),
            tok_per_s_1s: tok_per_s,
            tokens_total: step * 100,
            ..TrainView::default()
        },
        verdict,
        threads: vec![
            thread("target-0", Role::Target),
            thread("drafter-0", Role::Drafter),
        ],
        queues: vec![QueueView {
            name: "hs".into(),
            capacity: 2,
            ..QueueView::default()
        }],
        tok_history: vec![(1.0, tok_per_s), (2.0, tok_per_s)],
        ..Snapshot::default()
    }
}

fn parts<'a>(snaps: &'a [(&'a str, Snapshot, bool)]) -> Vec<Part<'a>> {
    snaps
        .iter()
        .map(|(label, snap, ended)| Part {
            label,
            snap,
            ended: *ended,
        })
        .collect()
}

#[test]
fn threads_and_queues_are_named_by_rank_and_tokens_summed() {
    let snaps = [
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", rank(3200.0, 11, Verdict::Balanced), false),
    ];
    let m = merge(&parts(&snaps), 7);
    let names: Vec<&str> = m.threads.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["r0/target-0", "r0/drafter-0", "r1/target-0", "r1/drafter-0"]
    );
    let queues: Vec<&str> = m.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(queues, ["r0/hs", "r1/hs"]);
    assert_eq!(m.train.tok_per_s_1s, 7200.0);
    assert_eq!(m.train.tokens_total, 2300);
    assert_eq!(m.train.step, 11, "the step of the rank furthest behind");
    assert_eq!(m.tok_history, vec![(1.0, 7200.0), (2.0, 7200.0)]);
    assert_eq!(m.seq, 7);
    let slow = m.slowest_rank().expect("two ranks running");
    assert_eq!((slow.name.as_str(), slow.tok_per_s), ("r1", 3200.0));
}

#[test]
fn the_worst_verdict_wins_with_its_rank_and_an_ended_rank_stops_counting() {
    let snaps = [
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", rank(3200.0, 11, Verdict::DrafterBound), false),
        ("r2", rank(3900.0, 12, Verdict::Warmup), false),
    ];
    let m = merge(&parts(&snaps), 1);
    assert_eq!(m.verdict, Verdict::DrafterBound);
    assert_eq!(m.worst_rank().map(|r| r.name.as_str()), Some("r1"));
    // A stall outranks a bottleneck, and its text names the rank.
    let mut stalled = rank(0.0, 12, Verdict::Stalled);
    stalled.stall = Some("target-0 in forward for 12.0 s".into());
    let snaps = [
        ("r0", stalled, false),
        ("r1", rank(3200.0, 11, Verdict::DrafterBound), false),
    ];
    let m = merge(&parts(&snaps), 1);
    assert_eq!(m.verdict, Verdict::Stalled);
    assert_eq!(
        m.stall.as_deref(),
        Some("r0/target-0 in forward for 12.0 s")
    );
    // r1 ended: its threads leave the view, its tokens stop counting, it stays listed.
    let snaps = [
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", rank(3200.0, 11, Verdict::DrafterBound), true),
    ];
    let m = merge(&parts(&snaps), 1);
    assert_eq!(m.train.tok_per_s_1s, 4000.0);
    assert!(m.threads.iter().all(|t| t.name.starts_with("r0/")));
    assert_eq!(m.verdict, Verdict::Balanced);
    assert!(m.ranks[1].ended && m.slowest_rank().is_none());
}

/// A rank's warning names its rank in its subject and in its evidence: the thread the
/// evidence names becomes `r1/drafter-0`, and a longer name or a word that only contains a
/// thread's name stays as it is.
#[test]
fn a_warnings_evidence_names_the_ranks_thread() {
    use crate::telemetry::warnings::{Rule, Severity, Warning};
    let mut r1 = rank(3200.0, 11, Verdict::Balanced);
    r1.warnings = vec![Warning {
        rule: Rule::ShapesVary,
        subject: "drafter".into(),
        severity: Severity::Warn,
        evidence: "drafter-0: 9 sizes, as drafter-01 and xdrafter-0 do not; like target-0.".into(),
        fix: "pad rows".into(),
        for_s: 6.0,
    }];
    let snaps = [
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", r1, false),
    ];
    let m = merge(&parts(&snaps), 1);
    let w = &m.warnings[0];
    assert_eq!(w.subject, "r1/drafter");
    assert_eq!(
        w.evidence,
        "r1/drafter-0: 9 sizes, as drafter-01 and xdrafter-0 do not; like r1/target-0."
    );
    assert_eq!(w.fix, "pad rows");
}

#[test]
fn a_session_that_never_reports_tokens_is_not_the_slowest() {
    let mut silent = rank(0.0, 40, Verdict::Balanced);
    silent.train.tokens_total = 0;
    let snaps = [
        ("p1", silent, false),
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", rank(3200.0, 11, Verdict::Balanced), false),
    ];
    let m = merge(&parts(&snaps), 1);
    assert_eq!(m.slowest_rank().map(|r| r.name.as_str()), Some("r1"));
    let line = crate::headless::rank_fields(&m);
    assert!(line.contains("p1.tok/s=- "), "{line}");
    assert!(line.contains("r1.tok/s=3200 "), "{line}");
    // A rank that counted tokens and now makes none is the slowest.
    let snaps = [
        ("r0", rank(4000.0, 12, Verdict::Balanced), false),
        ("r1", rank(0.0, 11, Verdict::Stalled), false),
    ];
    let m = merge(&parts(&snaps), 1);
    assert_eq!(m.slowest_rank().map(|r| r.name.as_str()), Some("r1"));
}

/// Each rank's caching allocator figures reach the merged view, added up on a device that
/// two processes share.
#[test]
fn the_ranks_allocators_are_kept_per_device_and_added_on_a_shared_one() {
    let on = |cuda: u32, gib: u64, churn: f64| AllocatorView {
        cuda,
        reserved_bytes: gib << 30,
        allocated_bytes: gib << 29,
        segments: 10 * gib,
        device_allocs: 5,
        device_frees: 3,
        alloc_retries: 1,
        churn_per_s: churn,
        retries_per_s: 0.0,
        graph_events: 0,
        host: None,
    };
    let mut r0 = rank(4000.0, 12, Verdict::Balanced);
    r0.allocator = vec![on(0, 4, 2.0)];
    let mut r1 = rank(3200.0, 11, Verdict::Balanced);
    r1.allocator = vec![on(1, 8, 0.0), on(0, 2, 1.0)];
    let snaps = [("r0", r0, false), ("r1", r1, false)];
    let m = merge(&parts(&snaps), 1);
    let devices: Vec<u32> = m.allocator.iter().map(|a| a.cuda).collect();
    assert_eq!(devices, [0, 1]);
    let shared = &m.allocator[0];
    assert_eq!(shared.reserved_bytes, 6 << 30);
    assert_eq!(
        (shared.segments, shared.device_allocs, shared.alloc_retries),
        (60, 10, 2)
    );
    assert_eq!(shared.churn_per_s, 3.0);
    assert_eq!(m.allocator[1], on(1, 8, 0.0));
}

/// Issue 30: GPUs per host. Two local ranks on one GPU show it once (their memory on it
/// added); a rank on another host shows its host's GPU 0 apart, under that host's name,
/// after this host's, and its allocator's cuda:0 is not added to ours.
#[test]
fn gpus_are_kept_per_host_and_shared_ones_shown_once() {
    let gpu = |host: Option<&str>, mem: u64| GpuView {
        index: 0,
        name: "NVIDIA H200".into(),
        util_pct: 90,
        mem_used_mib: 50_000,
        mem_total_mib: 143_771,
        power_w: 600.0,
        sm_clock_mhz: 1_980,
        temp_c: 60,
        util_history: vec![90],
        cuda: Some(0),
        mem_bw_pct: 40,
        proc_mem_mib: Some(mem),
        throttle: Vec::new(),
        host: host.map(String::from),
    };
    let alloc = |host: Option<&str>| AllocatorView {
        cuda: 0,
        reserved_bytes: 4 << 30,
        host: host.map(String::from),
        ..AllocatorView::default()
    };
    let on = |host: Option<&str>, mem: u64| {
        let mut r = rank(4000.0, 12, Verdict::Balanced);
        r.gpus = GpuPanel::Present(vec![gpu(host, mem)]);
        r.allocator = vec![alloc(host)];
        r
    };
    let snaps = [
        ("r2", on(Some("far"), 700), false),
        ("r0", on(None, 1_000), false),
        ("r1", on(None, 2_000), false),
    ];
    let m = merge(&parts(&snaps), 1);
    let GpuPanel::Present(gpus) = &m.gpus else {
        panic!("no GPUs: {:?}", m.gpus)
    };
    let shown: Vec<(Option<&str>, Option<u64>)> = gpus
        .iter()
        .map(|g| (g.host.as_deref(), g.proc_mem_mib))
        .collect();
    assert_eq!(shown, [(None, Some(3_000)), (Some("far"), Some(700))]);
    let reserved: Vec<(Option<&str>, u64)> = m
        .allocator
        .iter()
        .map(|a| (a.host.as_deref(), a.reserved_bytes >> 30))
        .collect();
    assert_eq!(reserved, [(None, 8), (Some("far"), 4)]);
    assert_eq!(
        m.allocator_of(Some("far"), 0).map(|a| a.reserved_bytes),
        Some(4 << 30)
    );
}
