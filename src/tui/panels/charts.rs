//! Loss and tok/s over time.

use super::Ctx;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Color;
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType};
use ratatui::Frame;

fn bounds(points: &[(f64, f64)]) -> ([f64; 2], [f64; 2]) {
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in points {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if points.is_empty() {
        return ([0.0, 1.0], [0.0, 1.0]);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    (
        [x0, x1],
        [y0.min(0.0).max(y0 - (y1 - y0) * 0.1), y1 + (y1 - y0) * 0.05],
    )
}

/// At most `n` points: the mean of each of `n` equal runs (a braille cell is 2 dots wide, so
/// more points than twice the width draw nothing new).
pub fn downsample(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
    if points.len() <= n || n == 0 {
        return points.to_vec();
    }
    let per = points.len().div_ceil(n);
    points
        .chunks(per)
        .map(|c| {
            let k = c.len() as f64;
            (
                c.iter().map(|p| p.0).sum::<f64>() / k,
                c.iter().map(|p| p.1).sum::<f64>() / k,
            )
        })
        .collect()
}

fn chart(f: &mut Frame, area: Rect, c: &Ctx, title: &str, points: &[(f64, f64)], color: Color) {
    let points = &downsample(points, 2 * area.width as usize);
    let (xb, yb) = bounds(points);
    let ds = Dataset::default()
        .marker(Marker::Braille)
        .graph_type(GraphType::Line)
        .style(c.theme.accent(color))
        .data(points);
    // Loss with its decimals; a rate as a whole number (or K, M): `6459`, `12.3K`.
    let label = |v: f64| {
        Span::raw(if title == "loss" {
            format!("{v:.2}")
        } else {
            super::header::fmt_rate(v)
        })
    };
    // The run's clock in one unit: seconds, or minutes past 10 of them.
    let secs = |v: f64| {
        if xb[1] >= 600.0 {
            format!("{:.0}m", v / 60.0)
        } else {
            format!("{v:.0}s")
        }
    };
    let chart = Chart::new(vec![ds])
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!(" {title} ")),
        )
        .x_axis(
            Axis::default()
                .bounds(xb)
                .labels(vec![Span::raw(secs(xb[0])), Span::raw(secs(xb[1]))]),
        )
        .y_axis(
            Axis::default()
                .bounds(yb)
                .labels(vec![label(yb[0]), label(yb[1])]),
        );
    f.render_widget(chart, area);
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx, vertical: bool) {
    let parts = if vertical {
        Layout::vertical([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).split(area)
    } else {
        Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).split(area)
    };
    chart(f, parts[0], c, "loss", &c.snap.loss_history, Color::Yellow);
    chart(f, parts[1], c, "tok/s", &c.snap.tok_history, Color::Cyan);
}
