//! GPUs from NVML, each under the `cuda:N` it is in this process (and its host's name when a
//! watched process on another host sent it): SM and memory-bandwidth
//! utilisation, device memory and this process's share of it, power, SM clock, temperature,
//! throttle reasons, libtorch's caching allocator there, a util history; in the title, the
//! placement advice from the measured stage times. No GPU: one plain line, not a panel.

use super::Ctx;
use crate::telemetry::snapshot::{AllocatorView, GpuPanel, GpuView};
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};
use ratatui::Frame;

/// Rows one GPU takes: two lines of numbers and a sparkline.
pub const ROWS_PER_GPU: u16 = 3;

/// Rows the GPU area wants: one line when there is no GPU, else a bordered panel.
pub fn height(gpus: &GpuPanel) -> u16 {
    match gpus {
        GpuPanel::Absent(_) => 1,
        GpuPanel::Present(g) => 2 + ROWS_PER_GPU * g.len().max(1) as u16,
    }
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let gpus = match &c.snap.gpus {
        GpuPanel::Absent(why) => {
            let line = format!("GPUs: {}", short(why));
            let row = Rect { height: 1, ..area };
            f.render_widget(Paragraph::new(Line::styled(line, c.theme.dim())), row);
            return;
        }
        GpuPanel::Present(g) => g,
    };
    // The split of targets and drafters the measured stage times call for.
    let title = match crate::telemetry::placement::for_snapshot(c.snap) {
        Some((advice, source)) => format!(" GPUs · placement ({source}): {} ", advice.text()),
        None => " GPUs ".to_string(),
    };
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let bottom = inner.y + inner.height;
    let mut y = inner.y;
    // This host's GPUs first, then each other host's; on each, the process's GPUs as cuda:0,
    // cuda:1, …, the hidden ones after.
    let mut gpus: Vec<&GpuView> = gpus.iter().collect();
    gpus.sort_by_key(|g| (g.host.clone(), g.cuda.is_none(), g.cuda, g.index));
    for g in gpus {
        if y >= bottom {
            break;
        }
        y = one(f, c, inner, g, y);
    }
}

/// One GPU's rows in `inner` from `y`, as many as fit: its two lines of numbers (the
/// allocator's on a third where they do not fit), its util history. Returns the next GPU's row.
fn one(f: &mut Frame, c: &Ctx, inner: Rect, g: &GpuView, mut y: u16) -> u16 {
    let bottom = inner.y + inner.height;
    let style = if g.cuda.is_some() {
        ratatui::style::Style::default()
    } else {
        c.theme.dim()
    };
    let row = |y: u16| Rect {
        x: inner.x,
        y,
        width: inner.width,
        height: 1,
    };
    let [first, mut second] = lines(g);
    // The allocator's figures after the power line, or on a line of their own when the
    // two do not fit side by side (a narrow panel).
    let mut own_line = None;
    if let Some(n) = g.cuda {
        let alloc = allocator_part(c.snap.allocator_of(g.host.as_deref(), n));
        if second.chars().count() + alloc.chars().count() <= inner.width as usize {
            second.push_str(&alloc);
        } else {
            own_line = Some(alloc);
        }
    }
    f.render_widget(Paragraph::new(first).style(style), row(y));
    if y + 1 < bottom {
        f.render_widget(Paragraph::new(second).style(style), row(y + 1));
    }
    if let Some(alloc) = own_line {
        y += 1;
        if y + 1 < bottom {
            f.render_widget(Paragraph::new(alloc).style(style), row(y + 1));
        }
    }
    if y + 2 < bottom {
        let data: Vec<u64> = g
            .util_history
            .iter()
            .rev()
            .take(inner.width as usize)
            .rev()
            .map(|u| *u as u64)
            .collect();
        f.render_widget(
            Sparkline::default()
                .data(&data)
                .max(100)
                .style(c.theme.accent(ratatui::style::Color::Green)),
            row(y + 2),
        );
    }
    y + ROWS_PER_GPU
}

/// The two lines of numbers for one GPU.
pub fn lines(g: &GpuView) -> [String; 2] {
    let device = match g.cuda {
        Some(n) => format!("cuda:{n}"),
        None => format!("nvml {} (hidden)", g.index),
    };
    // Another host's GPU (a session joined through a forwarded socket) under its host's name.
    let label = match &g.host {
        Some(h) => format!("{h}/{device}"),
        None => device,
    };
    let ours = g
        .proc_mem_mib
        .map(|m| format!(" ours {:.1}", m as f64 / 1024.0))
        .unwrap_or_default();
    let first = format!(
        "{label} {}  util {:3}%  bw {:3}%  mem {:.1}/{:.0} GiB{ours}",
        g.name.replace("NVIDIA ", ""),
        g.util_pct,
        g.mem_bw_pct,
        g.mem_used_mib as f64 / 1024.0,
        g.mem_total_mib as f64 / 1024.0,
    );
    let throttle = if g.throttle.is_empty() {
        String::new()
    } else {
        format!("  throttle {}", g.throttle.join(","))
    };
    let second = format!(
        "  {:.0} W  {} MHz  {} C{throttle}",
        g.power_w, g.sm_clock_mhz, g.temp_c
    );
    [first, second]
}

/// libtorch's caching allocator on one of our devices: allocated / reserved, segments, device
/// allocations + frees a second, retries in all; `n/a` where it is not read (no CUDA shim, or
/// another process watched), never a made-up zero.
pub fn allocator_part(a: Option<&AllocatorView>) -> String {
    let Some(a) = a else {
        return "  alloc n/a".into();
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    format!(
        "  alloc {:.1}/{:.1} GiB  {} seg  {:.0} malloc+free/s  {} retries",
        gib(a.allocated_bytes),
        gib(a.reserved_bytes),
        a.segments,
        a.churn_per_s,
        a.alloc_retries
    )
}

/// "no NVIDIA GPU (NVML not found)" without the loader's long explanation.
fn short(why: &str) -> &str {
    if why.is_empty() || why.starts_with("no NVIDIA GPU (NVML not found") {
        "no NVIDIA GPU (NVML not found)"
    } else {
        why
    }
}
