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
    out.sync_sites.extend(s.sync_sites.iter().map(|x| {
        let mut x = x.clone();
        x.thread = name(&x.thread);
        x
    }));
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
mod tests;
