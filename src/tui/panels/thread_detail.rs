//! The selected thread (the first in order when none is): its phases over the timeline's span,
//! the stacked shares of its phases over time, its CPU history, its phase times over each
//! window, its CUDA launches and syncs (CUPTI), the libtorch helper threads that work for it, and
//! its host syncs by call site.

use super::super::lanes::{lanes, phase_columns, TimeSpan};
use super::threads::states;
use super::timeline::{draw_lane, Palette};
use super::Ctx;
use crate::telemetry::names::Names;
use crate::telemetry::snapshot::{PhaseWindow, SyncSite, ThreadView};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Block, Borders, Sparkline};
use ratatui::Frame;

const LABEL_W: u16 = 9;

/// One window's line in `width` columns: its phases whole (named by `names`), `+N` for those
/// left out.
fn window_line(
    name: &str,
    w: &PhaseWindow,
    (t, names): (&ThreadView, &Names),
    off: Option<&str>,
    width: usize,
) -> String {
    match (w.wall_ns, off) {
        (0, Some(off)) => return format!("{name:>4}: {:.1} step/s · {off}", w.steps_per_s()),
        (0, None) => return format!("{name:>4}: no steps"),
        _ => {}
    }
    let parts = super::phases::phase_parts(w, names.phases(t.role), names);
    let head = format!("{name:>4}: {}/step · ", super::phases::fmt_ms(w.step_ms()));
    let room = width.saturating_sub(head.chars().count());
    format!("{head}{}", super::phases::whole_parts(&parts, room))
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let Some(t) = c.app.focus(c.snap) else {
        f.render_widget(
            Block::default()
                .borders(Borders::ALL)
                .title(" no threads yet "),
            area,
        );
        return;
    };
    let off = c.profiling_off();
    let block = Block::default().borders(Borders::ALL).title(title(
        (t, &c.snap.names),
        off.as_deref(),
        c.app.selected.is_none(),
    ));
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height < 4 || inner.width <= LABEL_W + 10 {
        return;
    }
    let pane = Pane {
        c,
        t,
        inner,
        x0: inner.x + LABEL_W,
        cols: inner.width - LABEL_W,
        span: c.app.time_span(),
    };
    // Fixed rows: the lane, three windows, the CUDA calls, the helpers; CPU and shares share
    // the rest up to their caps; what is left lists the thread's last steps.
    let rest = inner.height.saturating_sub(6);
    let cpu_h = (rest / 3).clamp(1, 6);
    let shares_h = rest.saturating_sub(cpu_h).min(12);
    let steps_h = rest - cpu_h - shares_h;
    let mut y = inner.y;
    y = pane.phases(f.buffer_mut(), y);
    y = pane.shares(f.buffer_mut(), y, shares_h);
    y = pane.cpu(f, y, cpu_h);
    y = pane.windows(f.buffer_mut(), y, off.as_deref());
    y = pane.cuda_calls(f.buffer_mut(), y);
    y = pane.helpers(f.buffer_mut(), y);
    // Its host syncs by call site, where known, before its last steps (at most 8 rows).
    let sites = c.snap.sites_of(t);
    let sites_h = match (sites.len() as u16 + 1).min(9).min(steps_h) {
        h if h >= 2 && !sites.is_empty() => h,
        _ => 0,
    };
    y = pane.sync_sites(f.buffer_mut(), y, sites_h, &sites);
    pane.last_steps(f.buffer_mut(), y, steps_h - sites_h);
}

/// The pane's title: the thread, its role and device, what it is in now, and the key that
/// selects or clears, in the words of `names`.
fn title((t, names): (&ThreadView, &Names), off: Option<&str>, none_selected: bool) -> String {
    let now_in = match off {
        // No phase is marked: what the kernel says instead.
        Some(off) => format!("{} ({off})", super::threads::os_word(t.os_state)),
        None => format!("{} for {:.1} s", names.phase(t.phase), t.phase_s),
    };
    format!(
        " {} · {} on {} · tid {} · {}{} ",
        t.name,
        names.role(t.role),
        t.device,
        t.tid,
        now_in,
        if none_selected {
            " · j/k selects"
        } else {
            " · esc clears"
        }
    )
}

/// The focused thread's pane inside its border: labels at the left, drawings from `x0` on,
/// `cols` wide. Each row group draws from row `y` and returns the row after it.
struct Pane<'a> {
    c: &'a Ctx<'a>,
    t: &'a ThreadView,
    inner: Rect,
    x0: u16,
    cols: u16,
    /// The timeline's span, which the lane, the shares and the last steps follow.
    span: TimeSpan,
}

impl Pane<'_> {
    fn label(&self, buf: &mut Buffer, y: u16, s: &str) {
        buf.set_string(self.inner.x, y, s, self.c.theme.dim());
    }

    /// A line across the pane, cut to its width.
    fn line(&self, buf: &mut Buffer, y: u16, line: &str, style: Style) {
        let line: String = line.chars().take(self.inner.width as usize).collect();
        buf.set_string(self.inner.x, y, line, style);
    }

    /// The thread's lane over the timeline's span.
    fn phases(&self, buf: &mut Buffer, y: u16) -> u16 {
        let (c, t) = (self.c, self.t);
        self.label(buf, y, "phases");
        let palette = Palette::new(c.theme);
        let now = Some(c.snap.now_ns).filter(|n| *n > 0 && !c.app.finished);
        let lane = lanes(
            &[t],
            c.app.shown_segments(),
            self.span,
            palette.halves() * self.cols as usize,
            now,
        );
        draw_lane(buf, self.x0, y, 1, &lane[0].cells, &palette);
        y + 1
    }

    /// The stacked shares of the thread's phases over the span, `height` rows (none at 0).
    fn shares(&self, buf: &mut Buffer, y: u16, height: u16) -> u16 {
        if height == 0 {
            return y;
        }
        let (c, t) = (self.c, self.t);
        let span = self.span;
        self.label(buf, y, "shares");
        self.label(buf, y + 1, &format!("{} s", span.width_ns as f64 / 1e9));
        let columns = phase_columns(
            &[t],
            c.app.shown_segments(),
            span,
            super::stacked::slices(self.cols),
        );
        let area = Rect {
            x: self.x0,
            y,
            width: self.cols,
            height,
        };
        let phases = c.snap.names.phases(t.role);
        super::stacked::draw(buf, area, &columns[0], phases, c.theme);
        y + height
    }

    /// The thread's CPU history as a sparkline, `height` rows.
    fn cpu(&self, f: &mut Frame, y: u16, height: u16) -> u16 {
        let (c, t) = (self.c, self.t);
        let cpu: Vec<u64> = c
            .app
            .shown_history()
            .cpu
            .get(&t.name)
            .map(|h| {
                h.iter()
                    .rev()
                    .take(self.cols as usize)
                    .rev()
                    .map(|v| *v as u64)
                    .collect()
            })
            .unwrap_or_default();
        let buf = f.buffer_mut();
        self.label(
            buf,
            y,
            &t.cpu_pct
                .map(|p| format!("cpu {p:.0}%"))
                .unwrap_or_else(|| "cpu -".into()),
        );
        let max = cpu.iter().copied().max().unwrap_or(100).max(100);
        if height > 1 {
            self.label(buf, y + 1, &format!("max {max}"));
        }
        f.render_widget(
            Sparkline::default()
                .data(&cpu)
                .max(max)
                .style(c.theme.accent(ratatui::style::Color::Green)),
            Rect {
                x: self.x0,
                y,
                width: self.cols,
                height,
            },
        );
        y + height
    }

    /// The thread's phase times over each window, one line each.
    fn windows(&self, buf: &mut Buffer, mut y: u16, off: Option<&str>) -> u16 {
        let t = self.t;
        for (name, w) in [("1s", &t.w1), ("10s", &t.w10), ("run", &t.run)] {
            let of = (t, &*self.c.snap.names);
            let line = window_line(name, w, of, off, self.inner.width as usize);
            self.line(buf, y, &line, Style::default());
            y += 1;
        }
        y
    }

    /// The thread's CUDA calls per step over the 10 s window, where CUPTI counts them: kernel
    /// launches, ms in launch calls, ms in sync calls; else why not (`n/a: cpu`).
    fn cuda_calls(&self, buf: &mut Buffer, y: u16) -> u16 {
        let line = match self.c.snap.cuda_calls(self.t, &self.t.w10) {
            Ok((launches, launch_ms, sync_ms)) => format!(
                "cuda 10s: {launches:.0} launches/step · {launch_ms:.1} ms launching · \
                 {sync_ms:.1} ms in syncs"
            ),
            Err(why) => format!("cuda: n/a: {why}"),
        };
        self.line(buf, y, &line, self.c.theme.dim());
        y + 1
    }

    /// The libtorch helper threads that work for this one.
    fn helpers(&self, buf: &mut Buffer, y: u16) -> u16 {
        let helpers: Vec<String> = self
            .c
            .snap
            .groups
            .iter()
            .filter(|g| g.owner.as_ref() == Some(&self.t.name))
            .map(|g| {
                format!(
                    "{} x{} {:.0}% {}",
                    g.name,
                    g.count,
                    g.cpu_pct,
                    states(&g.states)
                )
            })
            .collect();
        let line = if helpers.is_empty() {
            "helpers: none seen (libtorch's pools show once they run)".to_string()
        } else {
            format!("helpers: {}", helpers.join(" · "))
        };
        self.line(buf, y, &line, self.c.theme.dim());
        y + 1
    }

    /// The thread's host syncs by call site, the costliest first, a step each (`height` rows
    /// with the heading; none below 2).
    fn sync_sites(&self, buf: &mut Buffer, mut y: u16, height: u16, sites: &[SyncSite]) -> u16 {
        if height < 2 {
            return y;
        }
        let head = "host syncs by call site (a step: count, time):";
        buf.set_string(self.inner.x, y, head, self.c.theme.dim());
        y += 1;
        for s in sites.iter().take(height as usize - 1) {
            self.line(buf, y, &format!("  {}", s.per_step()), Style::default());
            y += 1;
        }
        y
    }

    /// The last steps, newest first: when each ended, its wall time, its phases (`height` rows
    /// with the heading; none below 2).
    fn last_steps(&self, buf: &mut Buffer, mut y: u16, height: u16) {
        if height <= 1 {
            return;
        }
        buf.set_string(
            self.inner.x,
            y,
            "last steps (ended, wall, phases in ms):",
            self.c.theme.dim(),
        );
        y += 1;
        let right = self.span.right_ns;
        let mine = self
            .c
            .app
            .shown_spans()
            .iter()
            .rev()
            .filter(|s| s.thread == self.t.name && s.end_ns <= right)
            .take(height as usize - 1);
        for s in mine {
            let phases: Vec<String> = s
                .phases
                .iter()
                .map(|(p, ns)| {
                    let name = self.c.snap.names.phase(*p);
                    format!("{name} {:.1}", *ns as f64 / 1e6)
                })
                .collect();
            let head = format!(
                "{:>8.2}s {:>8}  ",
                -((right - s.end_ns) as f64 / 1e9),
                super::phases::fmt_ms(s.wall_ns as f64 / 1e6),
            );
            let room = (self.inner.width as usize).saturating_sub(head.chars().count());
            let line = format!("{head}{}", super::phases::whole_parts(&phases, room));
            self.line(buf, y, &line, Style::default());
            y += 1;
        }
    }
}
