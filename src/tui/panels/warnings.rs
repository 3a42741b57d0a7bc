//! The warnings view: every warning in force, most severe first, with its evidence and its fix
//! (`telemetry::warnings` finds them); the header counts them by severity.

use super::Ctx;
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

/// `text` cut at spaces into lines of at most `width` columns, the first after `lead` (styled
/// `lead_style`), the rest indented as far: a hanging indent, so a long evidence or fix reads as
/// one block under its warning.
fn hanging(lead: &'static str, lead_style: Style, text: &str, width: usize) -> Vec<Line<'static>> {
    let room = width.saturating_sub(lead.chars().count()).max(20);
    let mut rows: Vec<String> = vec![String::new()];
    for word in text.split(' ') {
        let last = rows.last_mut().expect("one row at least");
        let len = last.chars().count();
        if len > 0 && len + 1 + word.chars().count() > room {
            rows.push(word.to_string());
        } else {
            if len > 0 {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    let indent = " ".repeat(lead.chars().count());
    rows.into_iter()
        .enumerate()
        .map(|(k, row)| {
            let first = match k {
                0 => Span::styled(lead, lead_style),
                _ => Span::raw(indent.clone()),
            };
            Line::from(vec![first, Span::raw(row)])
        })
        .collect()
}

fn lines_of(c: &Ctx, w: &Warning, width: usize) -> Vec<Line<'static>> {
    let mut out = vec![Line::from(vec![
        Span::styled(
            format!("{:<5} ", w.severity.name().to_uppercase()),
            severity_style(c, w.severity),
        ),
        Span::styled(w.key(), c.theme.bold()),
        Span::styled(format!("  for {:.0} s", w.for_s), c.theme.dim()),
    ])];
    out.extend(hanging("      ", Style::default(), &w.evidence, width));
    out.extend(hanging("      fix: ", c.theme.dim(), &w.fix, width));
    out
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
    let width = area.width.saturating_sub(2) as usize;
    for x in w {
        lines.extend(lines_of(c, x, width));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text(l: &Line) -> String {
        l.spans.iter().map(|s| s.content.as_ref()).collect()
    }

    #[test]
    fn long_text_hangs_under_its_lead_within_the_width() {
        let fix = "pack or pad batches to a few fixed lengths: each new shape takes new blocks \
                   from the caching allocator and runs outside CUDA graphs";
        let lines = hanging("      fix: ", Style::default(), fix, 60);
        let rows: Vec<String> = lines.iter().map(text).collect();
        assert!(rows.len() >= 3, "{rows:?}");
        assert!(rows[0].starts_with("      fix: pack or pad"), "{rows:?}");
        for r in &rows {
            assert!(r.chars().count() <= 60, "{r:?} is wider than 60");
        }
        for r in &rows[1..] {
            assert!(
                r.starts_with("           ") && !r[11..].starts_with(' '),
                "{r:?}"
            );
        }
        // Every word kept, in order.
        let words: Vec<&str> = rows.iter().flat_map(|r| r.split_whitespace()).collect();
        assert_eq!(words[1..].join(" "), fix);
        // Short text: one line.
        assert_eq!(hanging("  ", Style::default(), "one line", 60).len(), 1);
    }
}
