//! Header: step, tok/s, loss, tau, lr, elapsed, the profiling / GPU-timing / run badges, the
//! verdict, dropped records and what the profiler costs.

use super::super::view::Ctx;
use crate::telemetry::verdict::Verdict;
use ratatui::layout::Rect;
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

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let s = c.snap;
    let t = c.theme;
    // A number the pipeline never reported is absent, not a zero.
    let opt =
        |v: Option<f32>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "–".into());
    let badge = |on: bool, text: String| {
        let style = if on {
            t.ok().add_modifier(ratatui::style::Modifier::REVERSED)
        } else {
            t.alert()
        };
        Span::styled(format!(" {text} "), style)
    };
    let mut line1 = vec![
        Span::styled("dflash-top ", t.bold()),
        Span::raw(format!("step {}  ", s.train.step)),
        Span::styled(
            format!("tok/s {}  ", fmt_rate(s.train.tok_per_s_1s)),
            t.bold(),
        ),
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
    let line1 = Line::from(line1);
    let verdict_style = match s.verdict {
        Verdict::Balanced => t.ok(),
        Verdict::Warmup => t.dim(),
        _ => t.alert(),
    };
    let mut line2 = vec![
        badge(
            c.badges.profiling,
            format!("PROF {}", if c.badges.profiling { "on" } else { "off" }),
        ),
        Span::raw(" "),
    ];
    // On the CPU the GPU timing modes mean nothing: no badge.
    if s.gpu_timing.is_some() {
        line2.push(badge(true, format!("GPU {}", c.badges.gpu_timing.name())));
        line2.push(Span::raw(" "));
    }
    line2.push(
        match (c.badges.live, c.badges.paused, c.app.frozen.is_some()) {
            (false, _, _) => badge(false, "REPLAY".into()),
            _ if c.app.summary.is_some() => badge(true, "FINISHED".into()),
            (_, _, true) => badge(false, "FROZEN".into()),
            (_, true, _) => badge(false, "PAUSED".into()),
            _ => badge(true, "RUNNING".into()),
        },
    );
    line2.push(Span::raw("  "));
    let (verdict, verdict_style) = match (&s.verdict, &s.stall) {
        // The run is over: what was in force at its end no longer is.
        _ if c.app.summary.is_some() => ("finished".to_string(), t.ok()),
        (Verdict::Stalled, Some(what)) => (format!("stalled: {what}"), verdict_style),
        (v, _) => (v.text().to_string(), verdict_style),
    };
    line2.push(Span::styled(verdict, verdict_style));
    line2.extend(super::warnings::count_span(c));
    let line2 = Line::from(line2);
    let mut spans = Vec::new();
    // A failure that stays (a recording that stopped) comes before any passing note.
    for a in &s.alerts {
        spans.push(Span::styled(format!("! {a}  "), t.alert()));
    }
    if let Some(note) = c.app.note.as_ref().or(s.status.as_ref()) {
        spans.push(Span::styled(format!("» {note}  "), t.bold()));
    }
    spans.push(Span::styled(
        format!(
            "dropped {}{} · prof {:.0} ns/mark x {:.0}/s · snap {:.0}us · [{}] ? help q quit",
            s.self_cost.dropped,
            drops_detail(s.self_cost.spans_dropped, c.app.missed_snapshots),
            s.self_cost.ns_per_mark,
            s.self_cost.marks_per_s,
            s.self_cost.snapshot_us,
            c.app.view.title()
        ),
        t.dim(),
    ));
    let help = Line::from(spans);
    f.render_widget(Paragraph::new(vec![line1, line2, help]), area);
}
