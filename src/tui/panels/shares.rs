//! The phases view's lower half: the critical path of the pipeline in one sentence, and per
//! thread a stacked history of its phase shares over the timeline's span.

use super::super::critical::{stages, summary};
use super::super::lanes::phase_columns;
use super::Ctx;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::widgets::{Block, Borders, Paragraph, Wrap};
use ratatui::Frame;

const NAME_W: u16 = 11;

/// Rows the critical-path box wants at `width`: borders and the sentence wrapped.
pub fn critical_height(width: u16) -> u16 {
    if width < 120 {
        5
    } else {
        4
    }
}

pub fn render_critical(f: &mut Frame, area: Rect, c: &Ctx) {
    let windows: Vec<_> = c
        .snap
        .threads
        .iter()
        .map(|t| (t.role, c.window_of(t)))
        .collect();
    let names = &c.snap.names;
    let s = stages(windows.iter().map(|(r, w)| (*r, w)), names);
    let text = summary(&s, names).unwrap_or_else(|| match c.profiling_off() {
        Some(off) => format!("critical path: unknown, {off} (p turns it on)"),
        None => "critical path: no steps in the window yet".into(),
    });
    let block = Block::default()
        .borders(Borders::ALL)
        .title(format!(" critical path · window {} ", c.app.window.name()));
    f.render_widget(
        Paragraph::new(text).wrap(Wrap { trim: true }).block(block),
        area,
    );
}

pub fn render_history(f: &mut Frame, area: Rect, c: &Ctx) {
    let span = c.app.time_span();
    let block = Block::default().borders(Borders::ALL).title(format!(
        " phase shares over the last {} s (+/- zoom; bottom: the role's first phase) ",
        span.width_ns as f64 / 1e9
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let order = c.app.ordered_threads(c.snap);
    if inner.height == 0 || inner.width <= NAME_W + 4 || order.is_empty() {
        return;
    }
    let band = (inner.height / order.len() as u16).max(1);
    let shown = (inner.height / band) as usize;
    let cols = inner.width - NAME_W;
    let first = c
        .app
        .selected_index(&order)
        .filter(|i| *i >= shown)
        .map(|i| i + 1 - shown)
        .unwrap_or(0);
    let threads: Vec<_> = order.iter().skip(first).take(shown).copied().collect();
    let columns = phase_columns(
        &threads,
        c.app.shown_segments(),
        span,
        super::stacked::slices(cols),
    );
    let rows = Layout::vertical(threads.iter().map(|_| Constraint::Length(band))).split(inner);
    for ((t, col), row) in threads.iter().zip(&columns).zip(rows.iter()) {
        let name: String = t.name.chars().take(NAME_W as usize - 1).collect();
        f.buffer_mut()
            .set_string(row.x, row.y, name, Style::default());
        let area = Rect {
            x: row.x + NAME_W,
            width: cols,
            ..*row
        };
        let phases = c.snap.names.phases(t.role);
        super::stacked::draw(f.buffer_mut(), area, col, phases, c.theme);
    }
}
