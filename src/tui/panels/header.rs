//! Header: step, tok/s, loss, tau, lr, elapsed, the profiling / GPU-timing / run badges, the
//! verdict, dropped records and what the profiler costs.

use super::Ctx;
use crate::telemetry::queue_view::verdict_inputs;
use crate::telemetry::verdict::Verdict;
use crate::tui::app::fmt_clock;
use crate::tui::choices::View;
use crate::tui::theme::Badge;
use crate::wire::replay::ReplayPos;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

pub fn fmt_elapsed(s: f64) -> String {
    let s = s.max(0.0) as u64;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

pub fn fmt_rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Drops besides step records, when there are any: trace spans over the cap, snapshots this
/// front-end was too slow to take.
fn drops_detail(spans: u64, snapshots: u64) -> String {
    let mut out = String::new();
    if spans > 0 {
        out.push_str(&format!(" +{spans} spans"));
    }
    if snapshots > 0 {
        out.push_str(&format!(" +{snapshots} snaps"));
    }
    out
}

/// A merged view's slowest rank, `slowest r1 (3.2K tok/s)  ` (nothing for one process).
pub fn slowest_text(s: &crate::telemetry::Snapshot) -> String {
    s.slowest_rank()
        .map(|r| format!("slowest {} ({} tok/s)  ", r.name, fmt_rate(r.tok_per_s)))
        .unwrap_or_default()
}

/// A verdict judged from wait times (not a fact of the run: paused, stalled, warming up).
fn is_judged(v: Verdict) -> bool {
    !matches!(v, Verdict::Paused | Verdict::Stalled | Verdict::Warmup)
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let mut lines = vec![
        train_line(c, area.width),
        status_line(c),
        views_line(c, area.width),
    ];
    if let Some(pos) = c.badges.replay {
        lines.push(position_line(&pos, area.width, c));
    } else if let Some(line) = attached_line(c) {
        lines.push(line);
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// The first line: the step (with its ETA), tok/s, the slowest rank, loss, tau, lr, elapsed,
/// and the non-finite steps skipped, if any.
fn train_line(c: &Ctx, width: u16) -> Line<'static> {
    let s = c.snap;
    let t = c.theme;
    // A number the pipeline never reported is absent, not a zero.
    let opt =
        |v: Option<f32>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "–".into());
    // `step 163/300 ETA 0:42` when the run stops at --steps; the program's name gives way
    // where the line would not fit.
    let step = match c.app.progress() {
        Some((step, of, eta)) if c.app.summary.is_none() => format!(
            "step {step}/{of} {}  ",
            eta.map_or("ETA –".to_string(), |e| format!("ETA {}", fmt_clock(e)))
        ),
        _ => format!("step {}  ", s.train.step),
    };
    let name = if c.app.run_info.steps.is_some() && width < 100 {
        ""
    } else {
        "dflash-top "
    };
    let mut line1 = vec![
        Span::styled(name, t.bold()),
        Span::raw(step),
        Span::styled(format!("tok/s {}  ", tok_rate(s)), t.bold()),
        Span::styled(slowest_text(s), t.attention()),
        Span::raw(format!(
            "loss {}  tau {}  lr {}  {}",
            opt(s.train.loss, 3),
            opt(s.train.tau, 2),
            s.train
                .lr
                .map(|x| format!("{x:.1e}"))
                .unwrap_or_else(|| "–".into()),
            fmt_elapsed(s.elapsed_s)
        )),
    ];
    if s.train.skipped_nonfinite > 0 {
        line1.push(Span::styled(
            format!("  non-finite steps skipped {}", s.train.skipped_nonfinite),
            t.alert(),
        ));
    }
    Line::from(line1)
}

/// The second line: the profiling, GPU-timing and run badges, the verdict, the warnings' count and
/// what trains (the target, the precisions off their defaults).
fn status_line(c: &Ctx) -> Line<'static> {
    let s = c.snap;
    let t = c.theme;
    let badge = |kind: Badge, text: String| Span::styled(format!(" {text} "), t.badge(kind));
    let on_off = |on: bool| if on { Badge::Normal } else { Badge::Attention };
    let mut line2 = vec![
        badge(
            on_off(c.badges.profiling),
            format!("PROF {}", if c.badges.profiling { "on" } else { "off" }),
        ),
        Span::raw(" "),
    ];
    // On the CPU the GPU timing modes mean nothing: no badge.
    if s.gpu_timing.is_some() {
        line2.push(badge(
            Badge::Normal,
            format!("GPU {}", c.badges.gpu_timing.name()),
        ));
        line2.push(Span::raw(" "));
    }
    line2.push(
        match (c.badges.live, c.badges.paused, c.app.frozen.is_some()) {
            (false, _, _) => badge(Badge::Info, "REPLAY".into()),
            _ if c.app.summary.is_some() => badge(Badge::Normal, "FINISHED".into()),
            (_, _, true) => badge(Badge::Attention, "FROZEN".into()),
            (_, true, _) => badge(Badge::Attention, "PAUSED".into()),
            _ => badge(Badge::Normal, "RUNNING".into()),
        },
    );
    line2.push(Span::raw("  "));
    let (verdict, verdict_style) = verdict_text(c);
    line2.push(Span::styled(verdict, verdict_style));
    line2.extend(super::warnings::count_span(c));
    if let Some(model) = &c.app.run_info.model {
        line2.push(Span::styled(format!("  {model}"), t.dim()));
    }
    Line::from(line2)
}

/// The verdict as the header words it, and its style: `finished` once the run is over, the
/// stall's cause, what profiling off leaves of it, the worst rank's of a merged view.
fn verdict_text(c: &Ctx) -> (String, Style) {
    let s = c.snap;
    let t = c.theme;
    let verdict_style = t.verdict(s.verdict);
    let (verdict, verdict_style) = match (&s.verdict, &s.stall) {
        // The run is over: what was in force at its end no longer is.
        _ if c.app.summary.is_some() => ("finished".to_string(), t.ok()),
        (Verdict::Stalled, Some(what)) => (format!("stalled: {what}"), verdict_style),
        // Profiling off: the queues' wait times still come in (they are the queues' own), the
        // threads' phases do not; with no queue between known stages there is nothing to judge.
        (v, _) if c.profiling_off().is_some() && is_judged(*v) => {
            if verdict_inputs(&s.queues, &s.names).chain.is_empty() {
                (
                    "verdict unknown: profiling off, no queues to judge by".to_string(),
                    t.dim(),
                )
            } else {
                (
                    format!("{} (queues only)", s.names.verdict(*v)),
                    verdict_style,
                )
            }
        }
        (v, _) => (s.names.verdict(*v).to_string(), verdict_style),
    };
    let verdict = match s.worst_rank().filter(|_| s.ranks.len() > 1) {
        Some(r) if c.app.summary.is_none() => format!("{}: {verdict}", r.name),
        _ => verdict,
    };
    (verdict, verdict_style)
}

/// What the profiler costs, `(dropped, the rest)`, in long words and in short ones.
fn cost_texts(c: &Ctx) -> ((String, String), (String, String)) {
    let s = c.snap;
    let dropped = format!(
        "{}{}",
        s.self_cost.dropped,
        drops_detail(s.self_cost.spans_dropped, c.app.missed_snapshots)
    );
    let (ns, per_s, snap) = (
        s.self_cost.ns_per_mark,
        s.self_cost.marks_per_s,
        s.self_cost.snapshot_us,
    );
    let long = (
        format!("dropped {dropped}"),
        format!(" · prof {ns:.0} ns/mark x {per_s:.0}/s · snap {snap:.0}us"),
    );
    let short = (
        format!("drop {dropped}"),
        format!(" · prof {ns:.0}ns x{per_s:.0}/s · snap {snap:.0}us"),
    );
    (long, short)
}

/// The third line: the views' tabs, alerts, the note, what the profiler costs, `? help`.
fn views_line(c: &Ctx, width: u16) -> Line<'static> {
    let s = c.snap;
    let t = c.theme;
    let (long, short) = cost_texts(c);
    // Records lost are a fault: red once there are any.
    let lost = s.self_cost.dropped + s.self_cost.spans_dropped + c.app.missed_snapshots > 0;
    const HELP: &str = " · ? help";
    // The views' names where they fit beside what the profiler costs, else the digits with
    // the current one named; at the narrowest, the costs in short words.
    let fits = |tabs: usize, cost: &(String, String)| {
        tabs + 2 + cost.0.chars().count() + cost.1.chars().count() + HELP.len() <= width as usize
    };
    let full = fits(tab_bar(c, true).1, &long);
    let cost = if full || fits(tab_bar(c, false).1, &long) {
        long
    } else {
        short
    };
    let (mut spans, _) = tab_bar(c, full);
    spans.push(Span::raw("  "));
    // A failure that stays (a recording that stopped) comes before any passing note.
    for a in &s.alerts {
        spans.push(Span::styled(format!("! {a}  "), t.alert()));
    }
    if let Some(note) = c.app.note.as_ref().or(s.status.as_ref()) {
        spans.push(Span::styled(format!("» {note}  "), t.bold()));
    }
    spans.push(Span::styled(cost.0, if lost { t.alert() } else { t.dim() }));
    spans.push(Span::styled(cost.1, t.dim()));
    spans.push(Span::styled(HELP, t.dim()));
    Line::from(spans)
}

/// Watching other processes: which, and what `q` does (None where this front-end watches only
/// its own run).
fn attached_line(c: &Ctx) -> Option<Line<'static>> {
    let t = c.theme;
    let who = c.app.attached.as_ref()?;
    let q = match (c.app.finished, c.app.quit_stops_run) {
        (true, _) => "; q leaves",
        (false, true) => "; q stops the job (every rank, saving as set)",
        (false, false) => "; q detaches (the run goes on)",
    };
    Some(Line::from(vec![
        Span::styled("⇄ ", t.ok()),
        Span::styled(who.clone(), t.bold()),
        Span::styled(q, t.dim()),
    ]))
}

/// The views as tabs, the current one highlighted: `1 overview  2 threads  …` (`full`), or
/// `1 2 3 phases 4 5 6`. With the width it takes.
pub fn tab_bar(c: &Ctx, full: bool) -> (Vec<Span<'static>>, usize) {
    let t = c.theme;
    let mut spans = Vec::new();
    let mut width = 0;
    for v in View::ALL {
        let current = v == c.app.view;
        let text = if full || current {
            format!(" {} ", v.title())
        } else {
            format!(" {}", &v.title()[..1])
        };
        width += text.chars().count();
        let style = if current {
            if t.color {
                t.accent(Color::Cyan)
                    .add_modifier(Modifier::REVERSED | Modifier::BOLD)
            } else {
                Style::default().add_modifier(Modifier::REVERSED | Modifier::BOLD)
            }
        } else {
            t.dim()
        };
        spans.push(Span::styled(text, style));
    }
    (spans, width)
}

/// A replay's position bar: `▶ 2x  t=1:12 / 5:00  ━━━━━●────  space pause · …`; at the end
/// of the recording, a mark that says so.
pub fn position_line(pos: &ReplayPos, width: u16, c: &Ctx) -> Line<'static> {
    let t = c.theme;
    let ended = pos.at_end || c.app.summary.is_some();
    let (state, style) = if ended {
        ("■ end of recording".to_string(), t.bold())
    } else if pos.paused {
        (format!("‖ paused {}", pos.speed.name()), t.attention())
    } else {
        (format!("▶ {}", pos.speed.name()), t.ok())
    };
    let at = if ended {
        pos.duration_s
    } else {
        pos.position_s
    };
    let clock = format!(
        "  t={} / {}  ",
        fmt_clock(at.min(pos.duration_s)),
        fmt_clock(pos.duration_s)
    );
    let keys = if ended {
        "  < ← seek back · q leaves"
    } else {
        "  space pause · < > ← → seek 10 s · , . speed"
    };
    let used = (state.chars().count() + clock.chars().count() + keys.chars().count()) as u16;
    let bar_w = width.saturating_sub(used).clamp(10, 60) as usize;
    let done = if pos.duration_s > 0.0 {
        ((at / pos.duration_s).clamp(0.0, 1.0) * bar_w as f64).round() as usize
    } else {
        bar_w
    };
    Line::from(vec![
        Span::styled(state, style.add_modifier(ratatui::style::Modifier::BOLD)),
        Span::raw(clock),
        Span::styled("━".repeat(done), t.bold()),
        Span::styled("─".repeat(bar_w - done), t.dim()),
        Span::styled(keys, t.dim()),
    ])
}

/// The tokens a second, or `–` where no step has brought any (a pipeline whose tokens are not
/// known is not running at zero).
fn tok_rate(s: &crate::telemetry::Snapshot) -> String {
    match s.train.tokens_total {
        0 => "–".into(),
        _ => fmt_rate(s.train.tok_per_s_1s),
    }
}
