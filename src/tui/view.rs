//! Lays out the panels of each view and draws a frame from one snapshot.

use super::app::App;
use super::choices::View;
use super::panels::{self, Badges, Ctx};
use super::theme::Theme;
use crate::telemetry::snapshot::GpuPanel;
use crate::telemetry::Snapshot;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

pub fn draw(f: &mut Frame, app: &App, theme: Theme, badges: Badges) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let msg = format!(
            "too small: {}x{}, dflash-top needs {}x{}; enlarge it (q quits)",
            area.width, area.height, MIN_WIDTH, MIN_HEIGHT
        );
        // Wrapped, so that a terminal narrower than the sentence still shows all of it.
        f.render_widget(
            Paragraph::new(Line::from(msg)).wrap(Wrap { trim: true }),
            area,
        );
        return;
    }
    app.hits.borrow_mut().clear();
    let empty = Snapshot::default();
    let snap = app.shown().map(|s| s.as_ref()).unwrap_or(&empty);
    let c = Ctx {
        snap,
        app,
        theme: theme.for_names(&snap.names),
        badges,
    };
    // A replay's header has a fourth row, the position bar; an attached viewer's, what it
    // watches.
    let header_h = if badges.replay.is_some() || app.attached.is_some() {
        4
    } else {
        3
    };
    let [header, body] =
        Layout::vertical([Constraint::Length(header_h), Constraint::Min(0)]).areas(area);
    panels::header::render(f, header, &c);
    match app.view {
        View::Overview => overview(f, body, &c),
        View::Threads => threads_view(f, body, &c),
        View::Phases => phases_view(f, body, &c),
        View::Queues => queues_view(f, body, &c),
        View::Charts => panels::charts::render(f, body, &c, true),
        View::Warnings => panels::warnings::render(f, body, &c),
        View::Timeline => timeline_view(f, body, &c),
    }
    if app.help {
        panels::help::render(f, area, &c);
    }
}

/// The threads view: the table sized to its rows (at most half), the selected thread's detail
/// below.
fn threads_view(f: &mut Frame, body: Rect, c: &Ctx) {
    let table_h = panels::threads::height(c).clamp(5, body.height / 2);
    let [t, d] = Layout::vertical([Constraint::Length(table_h), Constraint::Min(0)]).areas(body);
    panels::threads::render(f, t, c, true);
    panels::thread_detail::render(f, d, c);
}

/// The phases view: the bars sized to their threads with each one's detail line, the critical
/// path, the shares over time in the rest; too little rest for a readable history: the
/// history goes (a whole panel), never a bar's detail.
fn phases_view(f: &mut Frame, body: Rect, c: &Ctx) {
    let bars_h = panels::phases::height(c, body.width, true);
    let crit_h = panels::shares::critical_height(body.width);
    let rest = body.height.saturating_sub(bars_h + crit_h);
    if rest >= 5 {
        let [bars, crit, history] = Layout::vertical([
            Constraint::Length(bars_h),
            Constraint::Length(crit_h),
            Constraint::Min(0),
        ])
        .areas(body);
        panels::phases::render(f, bars, c, true);
        panels::shares::render_critical(f, crit, c);
        panels::shares::render_history(f, history, c);
    } else {
        let [bars, crit] =
            Layout::vertical([Constraint::Min(0), Constraint::Length(crit_h)]).areas(body);
        panels::phases::render(f, bars, c, true);
        panels::shares::render_critical(f, crit, c);
    }
}

/// The queues view: the queues share all the room above the GPUs (their depth histories grow).
fn queues_view(f: &mut Frame, body: Rect, c: &Ctx) {
    let gpu_h = panels::gpus::height(&c.snap.gpus).min(body.height / 2);
    let [q, g] = Layout::vertical([Constraint::Min(0), Constraint::Length(gpu_h)]).areas(body);
    panels::queues::render(f, q, c);
    panels::gpus::render(f, g, c);
}

/// The timeline view: the phase bars of the same threads below, sized to their content (with
/// the detail lines where there is room); the timeline takes the rest (its lanes grow).
fn timeline_view(f: &mut Frame, body: Rect, c: &Ctx) {
    let want = panels::timeline::height(c);
    let detail = panels::phases::height(c, body.width, true);
    let plain = panels::phases::height(c, body.width, false);
    if body.height >= want + detail {
        let [t, p] = Layout::vertical([Constraint::Min(0), Constraint::Length(detail)]).areas(body);
        panels::timeline::render(f, t, c);
        panels::phases::render(f, p, c, true);
    } else if body.height >= want + plain {
        let [t, p] = Layout::vertical([Constraint::Min(0), Constraint::Length(plain)]).areas(body);
        panels::timeline::render(f, t, c);
        panels::phases::render(f, p, c, false);
    } else {
        panels::timeline::render(f, body, c);
    }
}

fn overview(f: &mut Frame, area: Rect, c: &Ctx) {
    // The phase bars' rows (borders, a row a thread, the legend), at most half.
    let phase_h = panels::phases::height(c, area.width * 58 / 100, false)
        .max(panels::threads::height(c).saturating_sub(c.snap.groups.len() as u16))
        .clamp(6, area.height / 2);
    let [top, bottom] =
        Layout::vertical([Constraint::Length(phase_h), Constraint::Min(0)]).areas(area);
    let [threads_area, phases_area] =
        Layout::horizontal([Constraint::Percentage(42), Constraint::Percentage(58)]).areas(top);
    panels::threads::render(f, threads_area, c, false);
    panels::phases::render(f, phases_area, c, false);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);
    // A run that ended: its summary on top of the left column.
    let left = if c.app.summary.is_some() {
        let [s, rest] = Layout::vertical([
            Constraint::Length(panels::summary::HEIGHT.min(left.height)),
            Constraint::Min(0),
        ])
        .areas(left);
        panels::summary::render(f, s, c);
        rest
    } else {
        left
    };
    // No GPU: the queues take the column and one line says so; else the GPU panel gets the rest.
    let [q, g] = if matches!(c.snap.gpus, GpuPanel::Absent(_)) {
        Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(left)
    } else {
        let queues_h = (c.snap.queues.len().max(1) as u16 * 6).min(left.height.saturating_sub(3));
        Layout::vertical([Constraint::Length(queues_h), Constraint::Min(3)]).areas(left)
    };
    panels::queues::render(f, q, c);
    panels::gpus::render(f, g, c);
    panels::charts::render(f, right, c, true);
}
