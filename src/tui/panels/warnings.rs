//! The warnings view: every warning in force, most severe first, with its evidence and its fix
//! (`telemetry::warnings` finds them); the header counts them by severity.

use super::super::view::Ctx;
use crate::telemetry::warnings::{counts, Rule, Severity, Warning};
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

/// The header's count: `⚠ 1 error 2 warn` (nothing when no warning is in force).
pub fn count_span(c: &Ctx) -> Option<Span<'static>> {
    let w = &c.snap.warnings;
    if w.is_empty() || c.app.summary.is_some() {
        return None;
    }
    let (e, wn, i) = counts(w);
    let mut parts = Vec::new();
    for (n, name) in [(e, "error"), (wn, "warn"), (i, "info")] {
        if n > 0 {
            parts.push(format!("{n} {name}"));
        }
    }
    // Red for a fault (an error), yellow for what needs attention, dim for information.
    let style = if e > 0 {
        c.theme.alert()
    } else if wn > 0 {
        c.theme.starved()
    } else {
        c.theme.dim()
    };
    Some(Span::styled(format!("  ⚠ {} (7)", parts.join(" ")), style))
}

fn severity_style(c: &Ctx, s: Severity) -> Style {
    match s {
        Severity::Error => c.theme.alert(),
        Severity::Warn => c.theme.starved(),
        Severity::Info => c.theme.dim(),
    }
}

fn lines_of<'a>(c: &Ctx, w: &'a Warning) -> [Line<'a>; 3] {
    [
        Line::from(vec![
            Span::styled(
                format!("{:<5} ", w.severity.name().to_uppercase()),
                severity_style(c, w.severity),
            ),
            Span::styled(w.key(), c.theme.bold()),
            Span::styled(format!("  for {:.0} s", w.for_s), c.theme.dim()),
        ]),
        Line::from(format!("      {}", w.evidence)),
        Line::from(vec![
            Span::styled("      fix: ", c.theme.dim()),
            Span::raw(w.fix.as_str()),
        ]),
    ]
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let w = &c.snap.warnings;
    let (e, wn, i) = counts(w);
    let title = format!(" warnings: {e} error · {wn} warn · {i} info ");
    let mut lines: Vec<Line> = Vec::new();
    if w.is_empty() {
        lines.push(Line::styled(
            "no warning in force: every rule is quiet",
            c.theme.ok(),
        ));
    }
    for x in w {
        lines.extend(lines_of(c, x));
    }
    // Every rule, whether it holds now, and what it watches ([warnings] in the TOML sets them).
    lines.push(Line::raw(""));
    lines.push(Line::styled(
        "rules ([warnings] in the TOML sets thresholds, severities, rules off)",
        c.theme.bold(),
    ));
    for r in Rule::ALL {
        let n = w.iter().filter(|x| x.rule == r).count();
        let (state, style) = if n > 0 {
            (format!("holds ×{n}"), c.theme.starved())
        } else {
            ("quiet".to_string(), c.theme.dim())
        };
        lines.push(Line::from(vec![
            Span::raw(format!("  {:<15}", r.name())),
            Span::styled(format!("{state:<10}"), style),
            Span::styled(r.watches(), c.theme.dim()),
        ]));
    }
    let p = Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::default().borders(Borders::ALL).title(title));
    f.render_widget(p, area);
}
