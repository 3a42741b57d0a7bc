//! Several sessions' snapshots as one (`attach --job`, `attach A B`): each session's threads,
//! queues, warnings and trace spans named by its rank (`r1/drafter-0`, `r1/hs`), the tokens a
//! second summed, the verdict the worst of the ranks' own, each rank's numbers kept in
//! `Snapshot::ranks`. Pure: src/wire/join_many.rs feeds it the latest snapshot of each session.

use crate::telemetry::snapshot::{
    AllocatorView, GpuPanel, GpuView, MemoryView, RankView, SelfCost, TrainView,
};
use crate::telemetry::Snapshot;

/// One session's latest snapshot and the name its threads take.
pub struct Part<'a> {
    /// `r1`, or `p1234` for a session with no job.
    pub label: &'a str,
    pub snap: &'a Snapshot,
    /// Its stream ended: its numbers no longer count (unless every session's ended).
    pub ended: bool,
}

/// `r1/drafter-0`.
pub fn prefixed(label: &str, name: &str) -> String {
    format!("{label}/{name}")
}

/// `text` with each whole-word occurrence of one of `names` (a thread's name, not inside a
/// longer name nor already after a `/`) named by `label`: `drafter-0: 9 sizes` becomes
/// `r1/drafter-0: 9 sizes`, so that a merged warning's evidence names the rank's thread.
fn prefix_words(text: &str, names: &[&str], label: &str) -> String {
    let part_of_name = |c: char| c.is_alphanumeric() || matches!(c, '-' | '_' | '/');
    let mut longest_first: Vec<&str> = names.iter().copied().filter(|n| !n.is_empty()).collect();
    longest_first.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut before: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let starts_word = before.is_none_or(|b| !part_of_name(b));
        let found = longest_first.iter().find(|n| {
            starts_word
                && rest.starts_with(**n)
                && rest[n.len()..]
                    .chars()
                    .next()
                    .is_none_or(|a| !part_of_name(a))
        });
        match found {
            Some(n) => {
                out.push_str(&prefixed(label, n));
                rest = &rest[n.len()..];
                before = n.chars().last();
            }
            None => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
                before = Some(c);
            }
        }
    }
    out
}

/// The parts whose numbers count: those still running, or all once every one ended.
fn counted<'a, 'b>(parts: &'b [Part<'a>]) -> Vec<&'b Part<'a>> {
    let live: Vec<&Part> = parts.iter().filter(|p| !p.ended).collect();
    if live.is_empty() {
        parts.iter().collect()
    } else {
        live
    }
}

/// The merged snapshot of `parts` (in rank order); `seq` is the merged view's own count.
pub fn merge(parts: &[Part], seq: u64) -> Snapshot {
    let on = counted(parts);
    let snaps: Vec<&Snapshot> = on.iter().map(|p| p.snap).collect();
    let mut out = Snapshot {
        seq,
        elapsed_s: snaps.iter().map(|s| s.elapsed_s).fold(0.0, f64::max),
        now_ns: snaps.iter().map(|s| s.now_ns).max().unwrap_or(0),
        train: train(&snaps),
        profiling: snaps.iter().any(|s| s.profiling),
        gpu_timing: snaps.iter().find_map(|s| s.gpu_timing),
        paused: snaps.iter().any(|s| s.paused),
        cpu_note: snaps.iter().find_map(|s| s.cpu_note.clone()),
        memory: memory(&snaps),
        gpus: gpus(&snaps),
        allocator: allocator(&snaps),
        cupti: snaps.iter().find_map(|s| s.cupti.clone()),
        stage_ratio_flops: snaps.iter().find_map(|s| s.stage_ratio_flops),
        loss_history: snaps
            .first()
            .map(|s| s.loss_history.clone())
            .unwrap_or_default(),
        tok_history: summed_history(&snaps),
        self_cost: self_cost(&snaps),
        ranks: parts.iter().map(rank_view).collect(),
        // At most one declared pipeline among trainers (src/wire/join_many.rs refuses more):
        // its names, which leave the built-in ones of our trainers' threads as they are.
        names: snaps
            .iter()
            .map(|s| &s.names)
            .find(|n| !n.is_builtin())
            .or(snaps.first().map(|s| &s.names))
            .cloned()
            .unwrap_or_default(),
        ..Snapshot::default()
    };
    for p in &on {
        add_named(&mut out, p);
    }
    if let Some(worst) = out.worst_rank().map(|r| r.name.clone()) {
        let part = parts.iter().find(|p| p.label == worst);
        if let Some(p) = part {
            out.verdict = p.snap.verdict;
            out.stall = p.snap.stall.as_ref().map(|s| prefixed(p.label, s));
        }
    }
    out
}

fn rank_view(p: &Part) -> RankView {
    RankView {
        name: p.label.to_string(),
        step: p.snap.train.step,
        tok_per_s: p.snap.train.tok_per_s_1s,
        verdict: p.snap.verdict,
        ended: p.ended,
        counts_tokens: p.snap.train.tokens_total > 0,
    }
}

/// A part's threads, groups, queues, spans, warnings and alerts, named by its label.
fn add_named(out: &mut Snapshot, p: &Part) {
    let s = p.snap;
    let name = |n: &str| prefixed(p.label, n);
    out.threads.extend(s.threads.iter().map(|t| {
        let mut t = t.clone();
        t.name = name(&t.name);
        t
    }));
    out.groups.extend(s.groups.iter().map(|g| {
        let mut g = g.clone();
        g.name = name(&g.name);
        g.owner = g.owner.as_deref().map(name);
        g
    }));
    out.queues.extend(s.queues.iter().map(|q| {
        let mut q = q.clone();
        q.name = name(&q.name);
        q
    }));
    out.steps.extend(s.steps.iter().map(|st| {
        let mut st = st.clone();
        st.thread = name(&st.thread);
        st
    }));
    let threads: Vec<&str> = s.threads.iter().map(|t| t.name.as_str()).collect();
    out.warnings.extend(s.warnings.iter().map(|w| {
        let mut w = w.clone();
        w.subject = name(&w.subject);
        w.evidence = prefix_words(&w.evidence, &threads, p.label);
        w.fix = prefix_words(&w.fix, &threads, p.label);
        w
    }));
    out.alerts
        .extend(s.alerts.iter().map(|a| format!("{}: {a}", p.label)));
}

/// The ranks' training numbers: tokens summed, the step of the rank furthest behind, loss and
/// tau averaged, the rest from the lowest rank.
fn train(snaps: &[&Snapshot]) -> TrainView {
    let Some(first) = snaps.first() else {
        return TrainView::default();
    };
    let mean = |f: fn(&TrainView) -> Option<f32>| {
        let vals: Vec<f32> = snaps.iter().filter_map(|s| f(&s.train)).collect();
        (!vals.is_empty()).then(|| vals.iter().sum::<f32>() / vals.len() as f32)
    };
    TrainView {
        step: snaps.iter().map(|s| s.train.step).min().unwrap_or(0),
        loss: mean(|t| t.loss),
        tau: mean(|t| t.tau),
        lr: first.train.lr,
        grad_norm: first.train.grad_norm,
        skipped_nonfinite: snaps.iter().map(|s| s.train.skipped_nonfinite).sum(),
        slot_acc: first.train.slot_acc.clone(),
        tokens_total: snaps.iter().map(|s| s.train.tokens_total).sum(),
        tok_per_s_1s: snaps.iter().map(|s| s.train.tok_per_s_1s).sum(),
        tok_per_s_10s: snaps.iter().map(|s| s.train.tok_per_s_10s).sum(),
    }
}

/// Tokens a second over time, summed point by point from the newest back (every hub keeps its
/// history at the same pace), as long as the shortest.
fn summed_history(snaps: &[&Snapshot]) -> Vec<(f64, f64)> {
    let Some(n) = snaps.iter().map(|s| s.tok_history.len()).min() else {
        return Vec::new();
    };
    (0..n)
        .map(|i| {
            let at = |s: &Snapshot| s.tok_history[s.tok_history.len() - n + i];
            let t = at(snaps[0]).0;
            (t, snaps.iter().map(|s| at(s).1).sum())
        })
        .collect()
}

/// The processes' memory summed; the host's as the first says.
fn memory(snaps: &[&Snapshot]) -> Option<MemoryView> {
    let all: Vec<MemoryView> = snaps.iter().filter_map(|s| s.memory).collect();
    let first = *all.first()?;
    Some(MemoryView {
        rss_mib: all.iter().map(|m| m.rss_mib).sum(),
        ..first
    })
}

/// Each host's GPUs once each (every local session reads the same devices through NVML; a
/// session on another host sends its host's), each process's memory on a device added up; this
/// host's first.
fn gpus(snaps: &[&Snapshot]) -> GpuPanel {
    let mut out: Vec<GpuView> = Vec::new();
    let mut absent = None;
    for s in snaps {
        match &s.gpus {
            GpuPanel::Absent(why) => absent = absent.or(Some(why.clone())),
            GpuPanel::Present(list) => {
                for g in list {
                    match out
                        .iter_mut()
                        .find(|o| o.index == g.index && o.host == g.host)
                    {
                        Some(o) => {
                            o.cuda = o.cuda.or(g.cuda);
                            o.proc_mem_mib = match (o.proc_mem_mib, g.proc_mem_mib) {
                                (Some(a), Some(b)) => Some(a + b),
                                (a, b) => a.or(b),
                            };
                        }
                        None => out.push(g.clone()),
                    }
                }
            }
        }
    }
    if out.is_empty() {
        return GpuPanel::Absent(absent.unwrap_or_default());
    }
    out.sort_by_key(|g| (g.host.clone(), g.index));
    GpuPanel::Present(out)
}

/// The caching allocators of the processes on each CUDA device, added up (`cuda:N` taken, like
/// the GPUs above, as the same device in every local session; another host's apart).
fn allocator(snaps: &[&Snapshot]) -> Vec<AllocatorView> {
    let mut out: Vec<AllocatorView> = Vec::new();
    for a in snaps.iter().flat_map(|s| &s.allocator) {
        let Some(o) = out
            .iter_mut()
            .find(|o| o.cuda == a.cuda && o.host == a.host)
        else {
            out.push(a.clone());
            continue;
        };
        o.reserved_bytes += a.reserved_bytes;
        o.allocated_bytes += a.allocated_bytes;
        o.segments += a.segments;
        o.device_allocs += a.device_allocs;
        o.device_frees += a.device_frees;
        o.alloc_retries += a.alloc_retries;
        o.graph_events += a.graph_events;
        o.churn_per_s += a.churn_per_s;
        o.retries_per_s += a.retries_per_s;
    }
    out.sort_by_key(|a| (a.host.clone(), a.cuda));
    out
}

fn self_cost(snaps: &[&Snapshot]) -> SelfCost {
    let n = snaps.len().max(1) as f64;
    SelfCost {
        marks_per_s: snaps.iter().map(|s| s.self_cost.marks_per_s).sum(),
        ns_per_mark: snaps.iter().map(|s| s.self_cost.ns_per_mark).sum::<f64>() / n,
        snapshot_us: snaps
            .iter()
            .map(|s| s.self_cost.snapshot_us)
            .fold(0.0, f64::max),
        dropped: snaps.iter().map(|s| s.self_cost.dropped).sum(),
        spans_dropped: snaps.iter().map(|s| s.self_cost.spans_dropped).sum(),
    }
}

#[cfg(test)]
mod tests {
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
            evidence: "drafter-0: 9 sizes, as drafter-01 and xdrafter-0 do not; like target-0."
                .into(),
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
}
