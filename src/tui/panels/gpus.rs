//! GPUs from NVML: util, memory, power, SM clock, temperature, util history; one plain line
//! when there is none.

use super::super::view::Ctx;
use crate::telemetry::snapshot::GpuPanel;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Sparkline};
use ratatui::Frame;

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let block = Block::default().borders(Borders::ALL).title(" GPUs ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let gpus = match &c.snap.gpus {
        GpuPanel::Absent(why) => {
            let line = if why.is_empty() {
                "no NVIDIA GPU (NVML not found)"
            } else {
                short(why)
            };
            f.render_widget(
                Paragraph::new(Line::styled(line.to_string(), c.theme.dim())),
                inner,
            );
            return;
        }
        GpuPanel::Present(g) => g,
    };
    let per = 2u16;
    let mut y = inner.y;
    for g in gpus {
        if y + 1 > inner.y + inner.height {
            break;
        }
        let line = format!(
            "{} {}  util {:3}%  mem {}/{} GiB  {:.0} W  {} MHz  {} C",
            g.index,
            g.name.replace("NVIDIA ", ""),
            g.util_pct,
            g.mem_used_mib / 1024,
            g.mem_total_mib / 1024,
            g.power_w,
            g.sm_clock_mhz,
            g.temp_c
        );
        let row = Rect {
            x: inner.x,
            y,
            width: inner.width,
            height: per.min(inner.y + inner.height - y),
        };
        let parts = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).split(row);
        f.render_widget(Paragraph::new(line), parts[0]);
        if parts[1].height > 0 {
            let data: Vec<u64> = g
                .util_history
                .iter()
                .rev()
                .take(parts[1].width as usize)
                .rev()
                .map(|u| *u as u64)
                .collect();
            f.render_widget(
                Sparkline::default()
                    .data(&data)
                    .max(100)
                    .style(c.theme.fg(ratatui::style::Color::Green)),
                parts[1],
            );
        }
        y += per;
    }
}

/// "no NVIDIA GPU (NVML not found)" without the loader's long explanation.
fn short(why: &str) -> &str {
    if why.starts_with("no NVIDIA GPU") {
        "no NVIDIA GPU (NVML not found)"
    } else {
        why
    }
}
