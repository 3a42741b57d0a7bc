//! Stacked per-phase wall-time bars: one bar per thread, one colour per phase, a legend, and
//! ms per step with each phase's share.

use super::Ctx;
use crate::telemetry::names::Names;
use crate::telemetry::snapshot::PhaseWindow;
use crate::telemetry::{GpuTiming, Phase};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use ratatui::Frame;

/// Splits `width` cells among phases by their share of wall time (largest remainder), in the
/// role's phase order. Phases with no time get no cell.
pub fn bar_cells(w: &PhaseWindow, phases: &[Phase], width: usize) -> Vec<(Phase, usize)> {
    let values: Vec<u64> = phases.iter().map(|p| w.phase_ns[p.index()]).collect();
    phases
        .iter()
        .zip(super::stacked::split(&values, width))
        .filter(|(_, n)| *n > 0)
        .map(|(p, n)| (*p, n))
        .collect()
}

fn draw_bar(buf: &mut Buffer, x: u16, y: u16, cells: &[(Phase, usize)], c: &Ctx) {
    let mut cx = x;
    for (p, n) in cells {
        let (ch, style) = c.theme.phase_cell(*p);
        for _ in 0..*n {
            buf[(cx, y)].set_char(ch).set_style(style);
            cx += 1;
        }
    }
}

/// Rows the legend takes at `width` columns: its items (`█name `) wrapped whole.
fn legend_rows(c: &Ctx, width: u16) -> u16 {
    let mut rows = 1u16;
    let mut used = 0usize;
    for s in legend(c).spans.chunks(2) {
        let w: usize = s.iter().map(|s| s.content.chars().count()).sum();
        if used > 0 && used + w.saturating_sub(1) > width as usize {
            rows += 1;
            used = 0;
        }
        used += w;
    }
    rows
}

/// Rows the panel wants at `width`: borders, a row a thread (two with `detail`), the legend.
pub fn height(c: &Ctx, width: u16, detail: bool) -> u16 {
    let per = if detail { 2 } else { 1 };
    2 + per * c.snap.threads.len().max(1) as u16 + legend_rows(c, width.saturating_sub(2))
}

/// A duration in ms in at most 7 columns: `80.0ms`, `999.9ms`, then seconds, then minutes —
/// a 20 s step fits where an 80 ms one does.
pub fn fmt_ms(ms: f64) -> String {
    if ms < 999.95 {
        format!("{ms:.1}ms")
    } else if ms < 99_950.0 {
        format!("{:.2}s", ms / 1e3)
    } else {
        format!("{:.1}m", ms / 60e3)
    }
}

/// The legend: every phase that has time in any shown thread, in a fixed order.
fn legend(c: &Ctx) -> Line<'static> {
    let mut spans = Vec::new();
    for p in Phase::ALL {
        let used = c
            .snap
            .threads
            .iter()
            .any(|t| c.window_of(t).phase_ns[p.index()] > 0);
        if used {
            let (ch, style) = c.theme.phase_cell(p);
            spans.push(Span::styled(format!("{ch}"), style));
            spans.push(Span::raw(format!("{} ", c.snap.names.phase(p))));
        }
    }
    Line::from(spans)
}

/// The panel's title: what the bars measure (by the GPU timing mode) and the window; with
/// profiling off, since when (a window that still holds time from before shows it).
fn title(c: &Ctx) -> String {
    let what = match c.snap.gpu_timing {
        Some(GpuTiming::Events) => "device time per step on GPUs (events)",
        Some(GpuTiming::Sync) => "wall time per step, GPU synced",
        Some(GpuTiming::Async) => "host wall time per step (GPU async)",
        None => "wall time per step",
    };
    match c.profiling_off() {
        Some(off) => format!(" phases, {} · {off} ", c.app.window.name()),
        None => format!(" phases: {what}, window {} ", c.app.window.name()),
    }
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx, detail: bool) {
    let block = Block::default().borders(Borders::ALL).title(title(c));
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.height == 0 || inner.width < 30 {
        return;
    }
    let off = c.profiling_off();
    // Room for the names, a little more for a merged view's (`r1/drafter-0`).
    let longest = c.snap.threads.iter().map(|t| t.name.chars().count()).max();
    let name_w = (longest.unwrap_or(0) as u16 + 1).clamp(11, 14);
    let stats_w = 26u16;
    let bar_w = inner.width.saturating_sub(name_w + stats_w + 2) as usize;
    let mut y = inner.y;
    let legend_rows = legend_rows(c, inner.width).min(inner.height.saturating_sub(1));
    let bottom = inner.y + inner.height - legend_rows;
    let buf = f.buffer_mut();
    for th in &c.snap.threads {
        if y >= bottom {
            break;
        }
        let w = c.window_of(th);
        let name: String = th.name.chars().take(name_w as usize - 1).collect();
        buf.set_string(inner.x, y, &name, c.name_style(&th.name, Style::default()));
        let row = Rect {
            x: inner.x + name_w,
            y,
            width: inner.width - name_w,
            height: 1,
        };
        if let (Some(off), 0) = (&off, w.wall_ns) {
            draw_off_note(buf, row, c, off, &w);
            y += 1;
            continue;
        }
        let phases = c.snap.names.phases(th.role);
        draw_bar_and_stats(buf, row, c, &w, phases, bar_w);
        y += 1;
        if detail && y < bottom && w.wall_ns > 0 {
            let parts = detail_parts(c, &w, phases);
            let text = whole_parts(&parts, inner.width as usize - 2);
            buf.set_string(inner.x + 2, y, text, c.theme.dim());
            y += 1;
        }
    }
    let legend_area = Rect {
        x: inner.x,
        y: bottom,
        width: inner.width,
        height: legend_rows,
    };
    f.render_widget(
        Paragraph::new(legend(c)).wrap(ratatui::widgets::Wrap { trim: true }),
        legend_area,
    );
}

/// A thread with no phase time in this window while profiling is `off`: says why, and what
/// is still counted, in `row`.
fn draw_off_note(buf: &mut Buffer, row: Rect, c: &Ctx, off: &str, w: &PhaseWindow) {
    let room = row.width as usize;
    let rate = format!("{:.1} step/s", w.steps_per_s());
    let mut text = format!("{off} · {rate}");
    if text.chars().count() > room {
        text = format!("{} · {rate}", off.trim_start_matches("profiling "));
    }
    buf.set_string(row.x, row.y, truncate(&text, room), c.theme.dim());
}

/// A thread's bar, `bar_w` cells from `row`'s left, then ms per step and its largest phase.
fn draw_bar_and_stats(
    buf: &mut Buffer,
    row: Rect,
    c: &Ctx,
    w: &PhaseWindow,
    phases: &[Phase],
    bar_w: usize,
) {
    let cells = bar_cells(w, phases, bar_w);
    draw_bar(buf, row.x, row.y, &cells, c);
    let top = phases
        .iter()
        .filter(|p| **p != Phase::Other)
        .max_by_key(|p| w.phase_ns[p.index()]);
    let stats = match top {
        Some(p) if w.wall_ns > 0 => format!(
            "{:>8} {:>12} {:3.0}%",
            fmt_ms(w.step_ms()),
            truncate(c.snap.names.phase(*p), 12),
            w.share(*p) * 100.0
        ),
        _ => "   no steps".to_string(),
    };
    buf.set_string(row.x + bar_w as u16 + 1, row.y, stats, Style::default());
}

/// The detail row's parts: each phase's ms and share, then the GPU's idle share.
fn detail_parts(c: &Ctx, w: &PhaseWindow, phases: &[Phase]) -> Vec<String> {
    // Phases under 0.05 ms a step say nothing here ("read 0.0ms 0%").
    let shown: Vec<Phase> = phases
        .iter()
        .copied()
        .filter(|p| w.ms_per_step(*p) >= 0.05)
        .collect();
    let mut parts = phase_parts(w, &shown, &c.snap.names);
    if w.gpu_idle_ns > 0 {
        parts.push(format!(
            "GPU idle {:.0}%",
            w.gpu_idle_ns as f64 / w.wall_ns as f64 * 100.0
        ));
    }
    parts
}

/// "forward 12.0ms 15%" for each phase with time in `w`; "sync 0.4ms 1% x56.2" for a phase the
/// producer counts (entries per step: a Python pipeline's host syncs); "metrics 0.3ms 2% 1.0
/// sync" for a phase with counted host syncs (per step: our engine's reads of the device).
/// Phases are named by `names`.
pub fn phase_parts(w: &PhaseWindow, phases: &[Phase], names: &Names) -> Vec<String> {
    phases
        .iter()
        .filter(|p| w.phase_ns[p.index()] > 0)
        .map(|p| {
            let mut s = format!(
                "{} {:.1}ms {:.0}%",
                names.phase(*p),
                w.ms_per_step(*p),
                w.share(*p) * 100.0
            );
            if w.phase_n[p.index()] > 0.0 {
                s.push_str(&format!(" x{:.1}", w.count_per_step(*p)));
            }
            if w.host_syncs[p.index()] > 0 {
                s.push_str(&format!(" {:.1} sync", w.host_syncs_per_step(*p)));
            }
            s
        })
        .collect()
}

/// As many whole parts as fit in `room` columns, two spaces apart; `+N` says how many more
/// there are (a part is never cut).
pub fn whole_parts(parts: &[String], room: usize) -> String {
    let all = parts.join("  ");
    if all.chars().count() <= room {
        return all;
    }
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        let rest = parts.len() - i - 1;
        let more = if rest > 0 {
            format!("  +{rest}").len()
        } else {
            0
        };
        let sep = if out.is_empty() { 0 } else { 2 };
        if out.chars().count() + sep + p.chars().count() + more > room {
            let left = parts.len() - i;
            let tail = format!("  +{left}");
            if out.chars().count() + tail.len() <= room {
                out.push_str(&tail);
            }
            return out;
        }
        if sep > 0 {
            out.push_str("  ");
        }
        out.push_str(p);
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
