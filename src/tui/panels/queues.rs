//! Queues: depth against capacity, a depth-history sparkline, share of time empty and full,
//! rates and item age. A queue whose consumers starve turns red with `▽`; one whose producers are
//! blocked turns yellow with `△` — told apart by colour and by glyph (NO_COLOR keeps the glyph).

use super::super::view::Ctx;
use crate::telemetry::snapshot::QueueView;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
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
    let rows = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .split(inner);
    let ratio = (q.depth as f64 / q.capacity.max(1) as f64).clamp(0.0, 1.0);
    let gauge = Gauge::default()
        .ratio(ratio)
        .label(format!(
            "depth {}/{} (min {} max {} mean {:.1})",
            q.depth, q.capacity, q.min_depth, q.max_depth, q.mean_depth
        ))
        .gauge_style(if alert.is_some() {
            alert_style
        } else {
            t.accent(ratatui::style::Color::Cyan)
        });
    f.render_widget(gauge, rows[0]);
    // The label where it lies on the filled part: dark text on the bright fill (the gauge
    // swaps in the terminal's own foreground there, light on yellow or cyan), light on the
    // light theme's darker fill.
    let on_fill = if t.light {
        ratatui::style::Color::Indexed(255)
    } else {
        ratatui::style::Color::Black
    };
    if t.color {
        let g = rows[0];
        let end = g.x + (g.width as f64 * ratio).floor() as u16;
        let buf = f.buffer_mut();
        for x in g.x..end.min(g.x + g.width) {
            let cell = &mut buf[(x, g.y)];
            if cell.symbol() != ratatui::symbols::block::FULL {
                cell.set_fg(on_fill);
            }
        }
    }
    // The alert first: it is what the panel is for when it is there.
    let mut spans = Vec::new();
    if let Some(a) = alert {
        spans.push(Span::styled(format!("{a}  "), alert_style));
    }
    spans.push(Span::raw(format!(
        "empty {:.0}% full {:.0}% push {:.1}/s pop {:.1}/s age {:.0}ms",
        q.empty_share * 100.0,
        q.full_share * 100.0,
        q.push_per_s,
        q.pop_per_s,
        q.mean_age_ms
    )));
    f.render_widget(Paragraph::new(Line::from(spans)), rows[1]);
    if rows[2].height > 0 {
        let width = rows[2].width as usize;
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
                .style(t.accent(ratatui::style::Color::Cyan)),
            rows[2],
        );
    }
}

/// Rows one queue wants: borders, the gauge, the numbers, three rows of depth history.
pub const QUEUE_H: u16 = 7;

/// Rows the queues want, stacked.
pub fn height(c: &Ctx) -> u16 {
    QUEUE_H * c.snap.queues.len().max(1) as u16
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let n = c.snap.queues.len().max(1) as u32;
    // Sized to their content where there is room; shared evenly where there is not.
    let areas = if area.height >= height(c) {
        Layout::vertical((0..n).map(|_| Constraint::Length(QUEUE_H))).split(area)
    } else {
        Layout::vertical((0..n).map(|_| Constraint::Ratio(1, n))).split(area)
    };
    for (q, a) in c.snap.queues.iter().zip(areas.iter()) {
        one(f, *a, q, c);
    }
}
