//! The summary of a run that ended: steps, tokens, time, mean tok/s, final loss and tau, and
//! where the last checkpoint and the recording are (`crate::summary` computes it, the same
//! numbers the exit line prints).

use super::header::{fmt_elapsed, fmt_rate};
use super::Ctx;
use crate::summary::Summary;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

/// Rows it takes: borders and seven lines.
pub const HEIGHT: u16 = 9;

/// The panel's lines (label, value).
pub fn rows(s: &Summary) -> Vec<(&'static str, String)> {
    let f = |v: Option<f32>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "–".into());
    let path = |p: &Option<std::path::PathBuf>, none: &str| {
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| none.into())
    };
    vec![
        (
            "steps",
            format!("{} (step {} → {})", s.steps(), s.from_step, s.step),
        ),
        ("tokens", fmt_rate(s.tokens as f64)),
        ("time", fmt_elapsed(s.elapsed_s)),
        ("mean tok/s", fmt_rate(s.mean_tok_s())),
        (
            "final",
            format!("loss {}  tau {}", f(s.loss, 4), f(s.tau, 3)),
        ),
        ("checkpoint", path(&s.checkpoint, "none (no --save-dir)")),
        ("recording", path(&s.recording, "none (no --record)")),
    ]
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let Some(s) = &c.app.summary else {
        return;
    };
    let t = c.theme;
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(t.ok())
        .title(Span::styled(" run finished ", t.ok()));
    let lines: Vec<Line> = rows(s)
        .into_iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:<11}"), t.dim()),
                Span::raw(v),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines).block(block), area);
}
