//! The timeline: one swimlane per thread over the last seconds, each phase a coloured segment
//! (waits hatched), the queue depths as strips under the lanes, the verdict's changes marked
//! above them. `+`/`-` zoom, `[`/`]` pan (freezing the display), `e` exports what is shown.
//! How a lane's and a strip's cells look: src/tui/panels/timeline/cells.rs.

use super::super::choices::ZOOMS_S;
use super::super::lanes::{lanes, queue_strip, TimeSpan};
use super::super::verdict_row::verdict_row;
use super::Ctx;
use crate::telemetry::names::Names;
use crate::telemetry::{Phase, N_PHASES};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

mod cells;
use cells::{depth_cell, swatch};
pub use cells::{draw_lane, Palette};

/// Width of the name column left of the lanes.
const NAME_W: u16 = 11;
/// The name column where the timeline is wide.
const WIDE_NAME_W: u16 = 20;
/// Rows a lane takes where there is room.
const LANE_ROWS: u16 = 2;

/// Rows the panel wants: borders, the axis, the verdict row, two rows a lane, a row a queue,
/// the legend.
pub fn height(c: &Ctx) -> u16 {
    5 + LANE_ROWS * c.snap.threads.len() as u16 + c.snap.queues.len() as u16
}

/// The lanes' name column at `width`: room for `hs_push_wait 12.0s` where the timeline is
/// wide, else the narrow one (where `in_progress` leaves words out rather than cut them).
fn name_width(width: u16) -> u16 {
    if width >= 110 {
        WIDE_NAME_W
    } else {
        NAME_W
    }
}

/// "forward 6.0s": the phase in progress and for how long, under a lane's name, in `room`
/// columns: the name alone, or the time alone, where both do not fit; never a cut word.
fn in_progress(t: &crate::telemetry::snapshot::ThreadView, names: &Names, room: usize) -> String {
    let d = if t.phase_s >= 10.0 {
        format!("{:.0}s", t.phase_s)
    } else if t.phase_s >= 1.0 {
        format!("{:.1}s", t.phase_s)
    } else {
        format!("{:.0}ms", t.phase_s * 1e3)
    };
    let name = names.phase(t.phase);
    let both = format!("{name} {d}");
    if both.chars().count() <= room {
        both
    } else if name.chars().count() <= room {
        name.to_string()
    } else {
        d
    }
}

/// An axis mark `s` seconds before now, in one unit for the whole axis (`width_s` wide): ms
/// below a second, else seconds with the decimals its quarter steps need (`-7.5s`, `-1.25s`).
pub fn fmt_offset(s: f64, width_s: f64) -> String {
    if s.abs() < 1e-9 {
        return "now".into();
    }
    if width_s < 1.0 {
        return format!("-{:.0}ms", s.abs() * 1e3);
    }
    let step = width_s / 4.0;
    let whole = |x: f64| (x - x.round()).abs() < 1e-6;
    let decimals = if whole(step) && whole(s) {
        0
    } else if whole(step * 10.0) && whole(s * 10.0) {
        1
    } else {
        2
    };
    format!("-{:.*}s", decimals, s.abs())
}

/// Time labels under the title: five marks, the right one "now" when not panned.
fn axis(buf: &mut Buffer, x: u16, y: u16, cols: u16, span: TimeSpan, pan_ns: u64, style: Style) {
    let width_s = span.width_ns as f64 / 1e9;
    let pan_s = pan_ns as f64 / 1e9;
    for k in 0..=4u16 {
        let col = (cols.saturating_sub(1) as u32 * k as u32 / 4) as u16;
        let label = format!(
            "┆{}",
            fmt_offset(pan_s + width_s * (4 - k) as f64 / 4.0, width_s)
        );
        let len = label.chars().count() as u16;
        let at = if k == 4 {
            (col + 1).saturating_sub(len)
        } else {
            col
        };
        buf.set_string(x + at, y, label, style);
    }
}

/// The panel's title: the window shown and its keys, or how far back a panned view stands;
/// "profiling off" first where no phase arrives (the lanes stop where it went off).
fn title(c: &Ctx) -> String {
    let app = c.app;
    let title = if app.pan_ns == 0 {
        format!(
            " timeline · last {} s · +/- zoom · [ ] pan · e exports it ",
            ZOOMS_S[app.zoom]
        )
    } else {
        format!(
            " timeline · {} s ending {:.2} s before the frozen time · ] later · f live ",
            ZOOMS_S[app.zoom],
            app.pan_ns as f64 / 1e9
        )
    };
    match c.profiling_off() {
        Some(off) => format!(
            " timeline · {off} ·{}",
            title.trim_start_matches(" timeline ·")
        ),
        None => title,
    }
}

/// Where the panel's parts go inside its borders.
struct Geometry {
    inner: Rect,
    /// The name column's width.
    name_w: u16,
    /// Where the lanes start, and how many columns they have.
    x0: u16,
    cols: u16,
    legend_rows: u16,
    queue_rows: u16,
    /// Rows for all lanes, rows a lane, and how many lanes fit.
    lane_rows: u16,
    lane_h: u16,
    lane_count: usize,
}

impl Geometry {
    /// The layout of `inner` for `threads` lanes and `queues` strips; None where it is too small.
    /// Axis, verdict row, lanes, one row a queue, the legend: queues give way to lanes first.
    fn new(inner: Rect, threads: usize, queues: usize) -> Option<Geometry> {
        let name_w = name_width(inner.width);
        if inner.width <= name_w + 10 || inner.height < 4 {
            return None;
        }
        // The legend wraps onto a second row where the timeline is narrow.
        let legend_rows = if inner.width < 120 { 2 } else { 1 };
        let fixed = 2 + legend_rows;
        let room = inner.height.saturating_sub(fixed);
        let queue_rows = (queues as u16).min(room.saturating_sub(threads.min(3) as u16));
        let lane_rows = room - queue_rows;
        // Two rows a lane where there is room: the second names the phase in progress.
        // Taller lanes where the view has the room: a bigger target for the eye and the mouse.
        let lane_h = (lane_rows / threads.max(1) as u16).max(1);
        Some(Geometry {
            inner,
            name_w,
            x0: inner.x + name_w,
            cols: inner.width - name_w,
            legend_rows,
            queue_rows,
            lane_rows,
            lane_h,
            lane_count: (lane_rows / lane_h) as usize,
        })
    }
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let block = Block::default().borders(Borders::ALL).title(title(c));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let order = c.app.ordered_threads(c.snap);
    let Some(g) = Geometry::new(inner, order.len(), c.snap.queues.len()) else {
        return;
    };
    let span = c.app.time_span();
    let palette = Palette::new(c.theme);
    let buf = f.buffer_mut();
    axis(
        buf,
        g.x0,
        inner.y,
        g.cols,
        span,
        c.app.pan_ns,
        c.theme.dim(),
    );
    draw_verdicts(buf, c, &g, inner.y + 1, span);
    let (shown, used) = draw_lanes(buf, c, &g, &order, span, &palette);
    // The queues right under the lanes.
    let y = inner.y + 2 + g.lane_h * shown as u16;
    draw_queues(buf, c, &g, y, span);
    let row = Rect {
        x: inner.x,
        y: inner.y + inner.height - g.legend_rows,
        width: inner.width,
        height: g.legend_rows,
    };
    f.render_widget(
        Paragraph::new(Line::from(legend(c, &palette, &used)))
            .wrap(ratatui::widgets::Wrap { trim: true }),
        row,
    );
}

/// The verdict row at `y`: the verdict in force at the left edge, then a mark where it changed.
fn draw_verdicts(buf: &mut Buffer, c: &Ctx, g: &Geometry, y: u16, span: TimeSpan) {
    let theme = c.theme;
    let (x0, cols) = (g.x0, g.cols);
    buf.set_string(g.inner.x, y, "verdict", theme.dim());
    let names = &*c.snap.names;
    let row = verdict_row(&c.app.shown_history().verdicts, span, cols as usize, names);
    if let Some(v) = row.at_left {
        buf.set_string(x0, y, v, theme.dim());
    }
    for m in &row.marks {
        let style = if m.fault {
            theme.alert()
        } else {
            theme.verdict(m.verdict)
        };
        let at = m.start as u16;
        buf.set_stringn(x0 + at, y, &m.text, (cols - at) as usize, style);
    }
}

/// The lanes under the verdict row, scrolled so that the selected thread is on screen, each
/// with its name (the mouse's target) and the phase in progress. Returns how many lanes it
/// drew and which phases they show.
fn draw_lanes(
    buf: &mut Buffer,
    c: &Ctx,
    g: &Geometry,
    order: &[&crate::telemetry::snapshot::ThreadView],
    span: TimeSpan,
    palette: &Palette,
) -> (usize, [bool; N_PHASES]) {
    let (app, theme) = (c.app, c.theme);
    let (x, lane_h) = (g.inner.x, g.lane_h);
    let first = match app.selected_index(order) {
        Some(i) if i >= g.lane_count => i + 1 - g.lane_count,
        _ => 0,
    };
    let shown: Vec<_> = order
        .iter()
        .skip(first)
        .take(g.lane_count)
        .copied()
        .collect();
    let now = Some(c.snap.now_ns).filter(|n| *n > 0 && !app.finished);
    let cells = palette.halves() * g.cols as usize;
    let rows = lanes(&shown, app.shown_segments(), span, cells, now);
    let mut used = [false; N_PHASES];
    let mut y = g.inner.y + 2;
    for (t, lane) in shown.iter().zip(&rows) {
        draw_label(buf, c, g, t, y);
        for p in lane.cells.iter().flatten() {
            used[p.index()] = true;
        }
        draw_lane(buf, g.x0, y, lane_h, &lane.cells, palette);
        y += lane_h;
    }
    let hidden = order.len() - shown.len();
    if hidden > 0 && g.lane_rows > 0 {
        let note = format!("+{hidden} (j/k)");
        buf.set_string(x, y - 1, format!("{note:<10}"), theme.dim());
    }
    (shown.len(), used)
}

/// A lane's label in the name column at row `y`: the thread's name (reversed where selected,
/// the mouse's target over the lane's rows), under it the phase in progress.
fn draw_label(
    buf: &mut Buffer,
    c: &Ctx,
    g: &Geometry,
    t: &crate::telemetry::snapshot::ThreadView,
    y: u16,
) {
    let (app, theme, names) = (c.app, c.theme, &*c.snap.names);
    let (x, name_w, lane_h) = (g.inner.x, g.name_w, g.lane_h);
    let selected = app.selected.as_ref() == Some(&t.name);
    let name_style = if selected {
        Style::default().add_modifier(Modifier::REVERSED)
    } else {
        Style::default()
    };
    let name: String = t.name.chars().take(name_w as usize - 1).collect();
    buf.set_string(x, y, name, c.name_style(&t.name, name_style));
    let mut hits = app.hits.borrow_mut();
    hits.extend((0..lane_h).map(|dy| (y + dy, t.name.clone())));
    drop(hits);
    if lane_h > 1 && t.state != crate::telemetry::snapshot::ThreadState::Exited {
        // The stalled thread's phase is the fault; a wait is worth a look.
        let style = if c.stalled_thread() == Some(t.name.as_str()) {
            theme.alert()
        } else if names.is_wait(t.phase) {
            theme.attention()
        } else {
            theme.dim()
        };
        let now_in = in_progress(t, names, name_w as usize - 1);
        buf.set_string(x, y + 1, now_in, style);
    }
}

/// A depth strip a queue from `y`, as many as the geometry has rows for.
fn draw_queues(buf: &mut Buffer, c: &Ctx, g: &Geometry, mut y: u16, span: TimeSpan) {
    let theme = c.theme;
    for q in c.snap.queues.iter().take(g.queue_rows as usize) {
        let style = if q.starving {
            theme.starved()
        } else if q.blocking {
            theme.blocked()
        } else {
            theme.dim()
        };
        let name: String = format!("q {}", q.name)
            .chars()
            .take(g.name_w as usize - 1)
            .collect();
        buf.set_string(g.inner.x, y, name, style);
        for (i, d) in queue_strip(q, span, g.cols as usize, c.snap.now_ns)
            .into_iter()
            .enumerate()
        {
            if let Some(d) = d {
                let (ch, style) = depth_cell(theme, d);
                buf[(g.x0 + i as u16, y)].set_char(ch).set_style(style);
            }
        }
        y += 1;
    }
}

/// The legend: a swatch for each phase the lanes show, then the strips' own glyphs and colours
/// (a cyan level while it holds some, yellow full).
fn legend(c: &Ctx, palette: &Palette, used: &[bool; N_PHASES]) -> Vec<Span<'static>> {
    let (theme, names) = (c.theme, &*c.snap.names);
    let mut legend = vec![Span::styled("phases ", theme.dim())];
    for p in Phase::ALL.iter().filter(|p| used[p.index()]) {
        let (ch, style) = swatch(palette, *p);
        legend.push(Span::styled(ch.to_string(), style));
        legend.push(Span::raw(format!("{} ", names.phase(*p))));
    }
    let (dot, dot_style) = depth_cell(theme, 0.0);
    let (level, level_style) = depth_cell(theme, 0.5);
    let (full, full_style) = depth_cell(theme, 1.0);
    legend.push(Span::styled("queue ", theme.dim()));
    legend.push(Span::styled(dot.to_string(), dot_style));
    legend.push(Span::raw("empty "));
    legend.push(Span::styled(level.to_string(), level_style));
    legend.push(Span::raw("depth "));
    legend.push(Span::styled(full.to_string(), full_style));
    legend.push(Span::raw("full"));
    legend
}
