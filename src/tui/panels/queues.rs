//! Queues: depth against capacity, a depth-history sparkline, share of time empty and full,
//! rates and item age. A queue whose consumers starve turns red with `▽`; one whose producers are
//! blocked turns yellow with `△` — told apart by colour and by glyph (NO_COLOR keeps the glyph).

use super::Ctx;
use crate::telemetry::snapshot::QueueView;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Gauge, Paragraph, Sparkline};
use ratatui::Frame;

/// What the queue says about its two sides, if anything: starved (`▽`) or blocked (`△`).
pub fn queue_alert(q: &QueueView) -> Option<String> {
    if q.starving {
        Some(format!(
            "▽ {}s starve: wait {:.0}% on empty",
            q.consumers,
            q.consumer_wait_share * 100.0
        ))
    } else if q.blocking {
        Some(format!(
            "△ {}s blocked: wait {:.0}% on full",
            q.producers,
            q.producer_wait_share * 100.0
        ))
    } else {
        None
    }
}

/// `items` in lines of at most `width` columns, two spaces apart, none cut.
fn wrap_items(items: &[String], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for it in items {
        if !line.is_empty() && line.chars().count() + 2 + it.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push_str("  ");
        }
        line.push_str(it);
    }
    lines.push(line);
    lines
}

/// A queue's panel: the depth gauge, the alert and the numbers, the depth history.
fn one(f: &mut Frame, area: Rect, q: &QueueView, c: &Ctx) {
    let t = c.theme;
    let alert = queue_alert(q);
    let alert_style = if q.starving { t.starved() } else { t.blocked() };
    let title = format!(" {} queue  {} → {} ", q.name, q.producers, q.consumers);
    let mut block = Block::default().borders(Borders::ALL).title(title);
    if alert.is_some() {
        block = block.border_style(alert_style);
    }
    let inner = block.inner(area);
    f.render_widget(block, area);
    let lines = text_lines(q, alert.as_ref().map(|a| (a, alert_style)), inner);
    let text_h = (lines.len() as u16).min(inner.height.saturating_sub(1));
    let rows = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(text_h),
        Constraint::Min(0),
    ])
    .split(inner);
    let gauge_style = if alert.is_some() {
        alert_style
    } else {
        t.accent(ratatui::style::Color::Cyan)
    };
    draw_gauge(f, rows[0], q, c, gauge_style);
    f.render_widget(Paragraph::new(lines), rows[1]);
    if rows[2].height > 0 {
        draw_history(f, rows[2], q, c);
    }
}

/// The alert (with its style) on a line of its own, then the numbers wrapped whole (never
/// cut) in `inner`'s width, leaving a row for the gauge.
fn text_lines(
    q: &QueueView,
    alert: Option<(&String, ratatui::style::Style)>,
    inner: Rect,
) -> Vec<Line<'static>> {
    let mut lines: Vec<Line> = Vec::new();
    if let Some((a, style)) = alert {
        lines.push(Line::styled(a.clone(), style));
    }
    let mut items = vec![
        format!("empty {:.0}%", q.empty_share * 100.0),
        format!("full {:.0}%", q.full_share * 100.0),
        format!("push {:.1}/s", q.push_per_s),
        format!("pop {:.1}/s", q.pop_per_s),
        format!("age {}", super::phases::fmt_ms(q.mean_age_ms)),
    ];
    // Fewer rows than the numbers need: the last of them go whole (age, pop, …).
    let room = inner.height.saturating_sub(1) as usize;
    loop {
        let wrapped = wrap_items(&items, inner.width as usize);
        if lines.len() + wrapped.len() <= room.max(lines.len() + 1) || items.len() <= 1 {
            lines.extend(wrapped.into_iter().map(Line::raw));
            break;
        }
        items.pop();
    }
    lines
}

/// The depth against capacity as a gauge in `area` (one row), its label legible on the fill.
fn draw_gauge(f: &mut Frame, area: Rect, q: &QueueView, c: &Ctx, style: ratatui::style::Style) {
    let t = c.theme;
    let ratio = (q.depth as f64 / q.capacity.max(1) as f64).clamp(0.0, 1.0);
    let gauge = Gauge::default()
        .ratio(ratio)
        .label(format!(
            "depth {}/{} (min {} max {} mean {:.1})",
            q.depth, q.capacity, q.min_depth, q.max_depth, q.mean_depth
        ))
        .gauge_style(style);
    f.render_widget(gauge, area);
    // The label where it lies on the filled part: dark text on the bright fill (the gauge
    // swaps in the terminal's own foreground there, light on yellow or cyan), light on the
    // light theme's darker fill.
    let on_fill = if t.light {
        ratatui::style::Color::Indexed(255)
    } else {
        ratatui::style::Color::Black
    };
    if t.color {
        let g = area;
        let end = g.x + (g.width as f64 * ratio).floor() as u16;
        let buf = f.buffer_mut();
        for x in g.x..end.min(g.x + g.width) {
            let cell = &mut buf[(x, g.y)];
            if cell.symbol() != ratatui::symbols::block::FULL {
                cell.set_fg(on_fill);
            }
        }
    }
}

/// The depth history as a sparkline, the latest `area.width` samples, as a share of capacity:
/// each column's top cell in the accent colour, the cells under it a dim shade, so a queue that
/// stays full reads as a line along the top over a muted fill rather than as a solid wall.
fn draw_history(f: &mut Frame, area: Rect, q: &QueueView, c: &Ctx) {
    let width = area.width as usize;
    let scale = 100.0 / q.capacity.max(1) as f64;
    let data: Vec<u64> = q
        .history
        .iter()
        .rev()
        .take(width)
        .rev()
        .map(|d| (d * scale).round() as u64)
        .collect();
    f.render_widget(
        Sparkline::default()
            .data(&data)
            .max(100)
            .style(c.theme.accent(ratatui::style::Color::Cyan)),
        area,
    );
    // Without colour the shade would say nothing the bars do not: the sparkline stays.
    if c.theme.color {
        mute_under_tops(f.buffer_mut(), area, c.theme.dim());
    }
}

/// In each column of `area`, the cells under its topmost drawn one become a light shade in
/// `under`'s style.
fn mute_under_tops(buf: &mut ratatui::buffer::Buffer, area: Rect, under: ratatui::style::Style) {
    for x in area.left()..area.right() {
        let top = (area.top()..area.bottom()).find(|&y| buf[(x, y)].symbol() != " ");
        if let Some(top) = top {
            for y in top + 1..area.bottom() {
                buf[(x, y)].set_symbol(SHADE).set_style(under);
            }
        }
    }
}

/// The fill under a depth history's tops.
const SHADE: &str = "░";

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let n = c.snap.queues.len().max(1) as u32;
    // Shared evenly: with more room than the numbers need, the depth histories grow.
    let areas = Layout::vertical((0..n).map(|_| Constraint::Ratio(1, n))).split(area);
    for (q, a) in c.snap.queues.iter().zip(areas.iter()) {
        one(f, *a, q, c);
    }
}
