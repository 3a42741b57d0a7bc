//! Headless front-end: one `key=value` line per interval (the training-log habit), then a
//! summary line; the follow loop `train --headless` and `attach --headless` share.

use crate::fail_if::Gate;
use crate::telemetry::flight::FlightRecorder;
use crate::telemetry::names::Names;
use crate::telemetry::snapshot::{GpuPanel, PhaseWindow, Snapshot, ThreadView};
use crossbeam_channel::Receiver;
use std::fmt::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one headless follow differs in: `train --headless` follows its own pipeline until it
/// finishes; `attach --headless` a watched session until it ends or the viewer's time is up.
pub struct Follow<'a> {
    /// One interval line per this much time.
    pub interval: Duration,
    /// When the viewer leaves (`attach --seconds`), if ever.
    pub deadline: Option<Instant>,
    /// True once what is followed has ended.
    pub ended: &'a dyn Fn() -> bool,
    /// The flight recorder whose dumps are printed (and taken when a gate holds).
    pub flight: Option<&'a FlightRecorder>,
    /// The job this process is a rank of: its interval lines say `rank=R/W`.
    pub job: Option<&'a crate::job::JobTag>,
}

/// How a follow ended: the last snapshot it saw, and the reason when a `--fail-if` gate held.
pub struct Followed {
    pub last: Option<Arc<Snapshot>>,
    pub tripped: Option<String>,
}

/// The interval lines and flight dumps of `snapshots` until a signal, the end, the deadline or
/// a `--fail-if` gate that holds; a gate that held prints its reason and dumps the last minute.
pub fn follow(snapshots: &Receiver<Arc<Snapshot>>, gates: &mut [Gate], how: &Follow) -> Followed {
    let mut next = Instant::now() + how.interval;
    let mut last = None;
    let mut tripped = None;
    while !crate::signals::requested()
        && !(how.ended)()
        && how.deadline.is_none_or(|d| Instant::now() < d)
    {
        if let Ok(s) = snapshots.recv_timeout(Duration::from_millis(50)) {
            if Instant::now() >= next {
                crate::signals::print_line(&with_rank(interval_line(&s), how.job));
                next += how.interval;
            }
            print_dumps(how.flight);
            tripped = crate::fail_if::first_tripped(gates, &s);
            last = Some(s);
            if tripped.is_some() {
                break;
            }
        }
    }
    if let Some(why) = &tripped {
        crate::signals::print_line(why);
        dump_now(how.flight, why);
    }
    Followed { last, tripped }
}

/// Prints the flight recorder's new dumps, one `flight:` line each.
fn print_dumps(flight: Option<&FlightRecorder>) {
    for d in flight.map(FlightRecorder::take_new).unwrap_or_default() {
        crate::signals::print_line(&d.line());
    }
}

/// A dump because a `--fail-if` gate held (unless one was written in the last minute).
fn dump_now(flight: Option<&FlightRecorder>, why: &str) {
    match flight.and_then(|f| f.dump_now(why)) {
        Some(Ok(d)) => crate::signals::print_line(&d.line()),
        Some(Err(e)) => eprintln!("dflash-top: {e:#}"),
        None => {}
    }
}

/// `line` with ` rank=R/W` at the end of its head (before the threads' fields), in a job.
fn with_rank(mut line: String, job: Option<&crate::job::JobTag>) -> String {
    if let Some(tag) = job {
        let at = line.find(" | ").unwrap_or(line.len());
        line.insert_str(at, &format!(" {}", tag.rank_field()));
    }
    line
}

/// One interval line from a snapshot.
pub fn interval_line(s: &Snapshot) -> String {
    let mut out = String::new();
    let f = |v: Option<f32>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    let _ = write!(
        out,
        "t={:.1}s step={} loss={} tau={} tok/s={} lr={} gnorm={} nonfinite={}",
        s.elapsed_s,
        s.train.step,
        f(s.train.loss, 4),
        f(s.train.tau, 3),
        // `-` where no step has brought tokens (not known, not zero).
        match s.train.tokens_total {
            0 => "-".into(),
            _ => format!("{:.0}", s.train.tok_per_s_1s.max(0.0)),
        },
        s.train
            .lr
            .map(|x| format!("{x:.2e}"))
            .unwrap_or_else(|| "-".into()),
        f(s.train.grad_norm, 3),
        s.train.skipped_nonfinite,
    );
    for t in &s.threads {
        let _ = write!(out, " | {}", t.name);
        let _ = write!(out, "{}", phase_fields(t, &s.names));
        // Its costliest host-sync call site, where they are known.
        if let Some(top) = s.sites_of(t).first() {
            let _ = write!(out, " sync_top=\"{}\"", top.per_step());
        }
        out.push_str(&cuda_call_fields(s, t, &t.w1));
    }
    for q in &s.queues {
        let _ = write!(
            out,
            " | q.{}={}/{} empty={:.0}% full={:.0}%",
            q.name,
            q.depth,
            q.capacity,
            q.empty_share * 100.0,
            q.full_share * 100.0
        );
    }
    out.push_str(&gpu_fields(s));
    out.push_str(&alloc_fields(s));
    let _ = write!(
        out,
        " | verdict={} dropped={}",
        s.names.verdict_short(s.verdict),
        s.self_cost.dropped
    );
    out.push_str(&rank_fields(s));
    out.push_str(&warning_fields(&s.warnings));
    if let Some(what) = &s.stall {
        let _ = write!(out, " stalled=\"{what}\"");
    }
    if let Some(mode) = s.gpu_timing {
        let _ = write!(out, " timing={}", mode.name());
    }
    if !s.profiling {
        out.push_str(" profiling=off");
    }
    for a in &s.alerts {
        let _ = write!(out, " alert={a:?}");
    }
    out
}

/// A merged view's ranks (`attach --job`): ` | r0.tok/s=3300 r0.step=40 r0.verdict=balanced …
/// slowest=r1 verdict.rank=r1`, `rN.ended=1` for a session that ended; nothing for one process.
pub fn rank_fields(s: &Snapshot) -> String {
    if s.ranks.is_empty() {
        return String::new();
    }
    let mut out = String::from(" |");
    for r in &s.ranks {
        let tok_s = match r.counts_tokens {
            true => format!("{:.0}", r.tok_per_s),
            false => "-".into(),
        };
        let _ = write!(
            out,
            " {n}.tok/s={tok_s} {n}.step={} {n}.verdict={}",
            r.step,
            s.names.verdict_short(r.verdict),
            n = r.name
        );
        if r.ended {
            let _ = write!(out, " {}.ended=1", r.name);
        }
    }
    if let Some(slow) = s.slowest_rank() {
        let _ = write!(out, " slowest={}", slow.name);
    }
    if let Some(worst) = s.worst_rank() {
        let _ = write!(out, " verdict.rank={}", worst.name);
    }
    out
}

/// ` warn=stalled:target-0,starved:drafter warn.error=1 warn.warn=1 warn.info=0`: the warnings
/// in force as `rule:subject`, most severe first, and their count by severity; nothing when none.
pub fn warning_fields(w: &[crate::telemetry::warnings::Warning]) -> String {
    if w.is_empty() {
        return String::new();
    }
    let (e, wn, i) = crate::telemetry::warnings::counts(w);
    let keys: Vec<String> = w.iter().map(|x| x.key()).collect();
    format!(
        " warn={} warn.error={e} warn.warn={wn} warn.info={i}",
        keys.join(",")
    )
}

/// ` | gpu0.util=97 gpu0.mem=81234` for each GPU this process sees as `cuda:N`: util is the SM
/// utilisation in percent, mem the memory used on the device (all processes) in MiB, both from
/// NVML; another host's (a session joined through a forwarded socket) as `HOST/gpu0.util=`.
/// Nothing without a GPU.
pub fn gpu_fields(s: &Snapshot) -> String {
    let GpuPanel::Present(gpus) = &s.gpus else {
        return String::new();
    };
    let mut ours: Vec<_> = gpus.iter().filter_map(|g| Some((g.cuda?, g))).collect();
    ours.sort_by_key(|(n, g)| (g.host.clone(), *n));
    let mut out = String::new();
    for (n, g) in ours {
        let sep = if out.is_empty() { " |" } else { "" };
        let at = host_prefix(g.host.as_deref());
        let _ = write!(
            out,
            "{sep} {at}gpu{n}.util={} {at}gpu{n}.mem={}",
            g.util_pct, g.mem_used_mib
        );
    }
    out
}

/// `HOST/` before another host's device fields; nothing for this host's.
fn host_prefix(host: Option<&str>) -> String {
    host.map(|h| format!("{h}/")).unwrap_or_default()
}

/// ` | alloc0=2.9/13.0GiB alloc0.seg=42 alloc0.churn/s=60 alloc0.retries=2` for each CUDA device
/// whose caching allocator is read (ours, or a watched process's): allocated / reserved GiB,
/// segments held, device allocations plus frees a second, retries so far, CUDA graph captures
/// begun and ended there so far (where any were); another host's as
/// `HOST/alloc0=`. Nothing where the figures are not read (the CPU, no CUDA shim, a producer
/// that does not send them).
pub fn alloc_fields(s: &Snapshot) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let mut out = String::new();
    for a in &s.allocator {
        let sep = if out.is_empty() { " |" } else { "" };
        let (at, n) = (host_prefix(a.host.as_deref()), a.cuda);
        // CUDA graph captures begun and ended there, where any were.
        let graphs = match a.graph_events {
            0 => String::new(),
            g => format!(" {at}alloc{n}.graphs={g}"),
        };
        let _ = write!(
            out,
            "{sep} {at}alloc{n}={:.1}/{:.1}GiB {at}alloc{n}.seg={} {at}alloc{n}.churn/s={:.0} \
             {at}alloc{n}.retries={}{graphs}",
            gib(a.allocated_bytes),
            gib(a.reserved_bytes),
            a.segments,
            a.churn_per_s,
            a.alloc_retries,
        );
    }
    out
}

/// A thread's step time and the phases of its role it entered (over the run), named by `names`.
fn phase_fields(t: &ThreadView, names: &Names) -> String {
    let w = &t.w1;
    let mut out = format!(" step_ms={:.1}", w.step_ms());
    for p in &t.run.entered_of(names.phases(t.role)) {
        let name = names.phase(*p);
        let _ = write!(out, " {name}_ms={:.1}", w.ms_per_step(*p));
        // Entries per step, for the phases the producer counts (host syncs).
        if w.phase_n[p.index()] > 0.0 {
            let _ = write!(out, " {name}_n={:.1}", w.count_per_step(*p));
        }
        // Host syncs per step, where the producer counts them (our engine's device reads).
        if w.host_syncs[p.index()] > 0 {
            let _ = write!(out, " {name}_syncs={:.1}", w.host_syncs_per_step(*p));
        }
    }
    if w.gpu_idle_ns > 0 && w.wall_ns > 0 {
        let _ = write!(
            out,
            " gpu_idle={:.0}%",
            w.gpu_idle_ns as f64 / w.wall_ns as f64 * 100.0
        );
    }
    out
}

/// ` launches=412 launch_ms=3.1 cusync_ms=0.4`: the thread's CUDA kernel launches per step and
/// its ms per step in launch and sync calls, where CUPTI counts them; ` launches=n/a` where not
/// (the TUI and the `config:` line's `cupti=` say why).
pub fn cuda_call_fields(s: &Snapshot, t: &ThreadView, w: &PhaseWindow) -> String {
    match s.cuda_calls(t, w) {
        Ok((launches, launch_ms, sync_ms)) => {
            format!(" launches={launches:.0} launch_ms={launch_ms:.1} cusync_ms={sync_ms:.1}")
        }
        Err(_) => " launches=n/a".into(),
    }
}

/// The last line of a run (`crate::summary` computes it).
pub fn summary_line(s: &Snapshot, start_step: u64) -> String {
    let info = crate::summary::RunInfo {
        start_step,
        ..Default::default()
    };
    crate::summary::Summary::of(s, &info).line()
}
