//! The selected thread (the first in order when none is): its phases over the timeline's span,
//! the stacked shares of its phases over time, its CPU history, its phase times over each
//! window, and the libtorch helper threads that work for it.

use super::super::lanes::{lanes, phase_columns};
use super::super::view::Ctx;
use super::threads::states;
use super::timeline::{draw_lane, Palette};
use crate::telemetry::snapshot::{PhaseWindow, ThreadView};
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Block, Borders, Sparkline};
use ratatui::Frame;

const LABEL_W: u16 = 9;

/// One window's line in `width` columns: its phases whole, `+N` for those left out.
fn window_line(
    name: &str,
    w: &PhaseWindow,
    t: &ThreadView,
    off: Option<&str>,
    width: usize,
) -> String {
    match (w.wall_ns, off) {
        (0, Some(off)) => return format!("{name:>4}: {:.1} step/s · {off}", w.steps_per_s()),
        (0, None) => return format!("{name:>4}: no steps"),
        _ => {}
    }
    let parts = super::phases::phase_parts(w, t.role.phases());
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
    let now_in = match &off {
        // No phase is marked: what the kernel says instead.
        Some(off) => format!("{} ({off})", super::threads::os_word(t.os_state)),
        None => format!("{} for {:.1} s", t.phase.name(), t.phase_s),
    };
    let title = format!(
        " {} · {} on {} · tid {} · {}{} ",
        t.name,
        t.role.name(),
        t.device,
        t.tid,
        now_in,
        if c.app.selected.is_none() {
            " · j/k selects"
        } else {
            " · esc clears"
        }
    );
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height < 4 || inner.width <= LABEL_W + 10 {
        return;
    }
    let theme = c.theme;
    let x0 = inner.x + LABEL_W;
    let cols = inner.width - LABEL_W;
    let span = c.app.time_span();
    let spans = c.app.shown_spans();
    // Fixed rows: the lane, three windows, the helpers; CPU and shares share the rest up to
    // their caps; what is left lists the thread's last steps.
    let rest = inner.height.saturating_sub(5);
    let cpu_h = (rest / 3).clamp(1, 6);
    let shares_h = rest.saturating_sub(cpu_h).min(12);
    let steps_h = rest - cpu_h - shares_h;
    let mut y = inner.y;
    let buf = f.buffer_mut();
    let label = |buf: &mut ratatui::buffer::Buffer, y: u16, s: &str| {
        buf.set_string(inner.x, y, s, theme.dim());
    };

    label(buf, y, "phases");
    let palette = Palette::new(theme);
    let now = Some(c.snap.now_ns).filter(|n| *n > 0 && !c.app.finished);
    let lane = lanes(
        &[t],
        c.app.shown_segments(),
        span,
        palette.halves() * cols as usize,
        now,
    );
    draw_lane(buf, x0, y, 1, &lane[0].cells, &palette);
    y += 1;

    if shares_h > 0 {
        label(buf, y, "shares");
        label(buf, y + 1, &format!("{} s", span.width_ns as f64 / 1e9));
        let columns = phase_columns(
            &[t],
            c.app.shown_segments(),
            span,
            super::stacked::slices(cols),
        );
        let area = Rect {
            x: x0,
            y,
            width: cols,
            height: shares_h,
        };
        super::stacked::draw(buf, area, &columns[0], t.role.phases(), theme);
        y += shares_h;
    }

    let cpu: Vec<u64> = c
        .app
        .shown_history()
        .cpu
        .get(&t.name)
        .map(|h| {
            h.iter()
                .rev()
                .take(cols as usize)
                .rev()
                .map(|v| *v as u64)
                .collect()
        })
        .unwrap_or_default();
    label(
        buf,
        y,
        &t.cpu_pct
            .map(|p| format!("cpu {p:.0}%"))
            .unwrap_or_else(|| "cpu -".into()),
    );
    let max = cpu.iter().copied().max().unwrap_or(100).max(100);
    if cpu_h > 1 {
        label(buf, y + 1, &format!("max {max}"));
    }
    f.render_widget(
        Sparkline::default()
            .data(&cpu)
            .max(max)
            .style(theme.accent(ratatui::style::Color::Green)),
        Rect {
            x: x0,
            y,
            width: cols,
            height: cpu_h,
        },
    );
    y += cpu_h;

    let buf = f.buffer_mut();
    for (name, w) in [("1s", &t.w1), ("10s", &t.w10), ("run", &t.run)] {
        let line: String = window_line(name, w, t, off.as_deref(), inner.width as usize)
            .chars()
            .take(inner.width as usize)
            .collect();
        buf.set_string(inner.x, y, line, Style::default());
        y += 1;
    }

    let helpers: Vec<String> = c
        .snap
        .groups
        .iter()
        .filter(|g| g.owner.as_ref() == Some(&t.name))
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
    let line: String = line.chars().take(inner.width as usize).collect();
    buf.set_string(inner.x, y, line, theme.dim());
    y += 1;

    // The last steps, newest first: when each ended, its wall time, its phases.
    if steps_h > 1 {
        buf.set_string(
            inner.x,
            y,
            "last steps (ended, wall, phases in ms):",
            theme.dim(),
        );
        y += 1;
        let right = span.right_ns;
        let mine = spans
            .iter()
            .rev()
            .filter(|s| s.thread == t.name && s.end_ns <= right)
            .take(steps_h as usize - 1);
        for s in mine {
            let phases: Vec<String> = s
                .phases
                .iter()
                .map(|(p, ns)| format!("{} {:.1}", p.name(), *ns as f64 / 1e6))
                .collect();
            let head = format!(
                "{:>8.2}s {:>8}  ",
                -((right - s.end_ns) as f64 / 1e9),
                super::phases::fmt_ms(s.wall_ns as f64 / 1e6),
            );
            let room = (inner.width as usize).saturating_sub(head.chars().count());
            let line = format!("{head}{}", super::phases::whole_parts(&phases, room));
            let line: String = line.chars().take(inner.width as usize).collect();
            buf.set_string(inner.x, y, line, Style::default());
            y += 1;
        }
    }
}
