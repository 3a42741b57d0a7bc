//! Threads: name, role, device, CPU % per OS thread, current phase, state; libtorch's own
//! threads (and other unregistered ones) grouped by name.

use super::super::view::Ctx;
use crate::telemetry::snapshot::ThreadState;
use ratatui::layout::{Constraint, Rect};
use ratatui::widgets::{Block, Borders, Cell, Row, Table};
use ratatui::Frame;

/// `full`: every column and libtorch's own threads (the threads view); otherwise the compact
/// columns that fit beside the phase bars.
pub fn render(f: &mut Frame, area: Rect, c: &Ctx, full: bool) {
    let t = c.theme;
    let show_groups = full;
    let header = Row::new([
        "thread", "role", "dev", "cpu%", "phase", "state", "step/s", "ms/step",
    ])
    .style(t.bold());
    let mut rows: Vec<Row> = c
        .snap
        .threads
        .iter()
        .map(|th| {
            let w = c.window_of(th);
            let state_style = match th.state {
                ThreadState::Waiting => t.alert(),
                ThreadState::Exited => t.dim(),
                ThreadState::Working => t.ok(),
            };
            Row::new(vec![
                Cell::from(th.name.clone()),
                Cell::from(th.role.name()),
                Cell::from(th.device.clone()),
                Cell::from(
                    th.cpu_pct
                        .map(|x| format!("{x:.0}"))
                        .unwrap_or_else(|| "-".into()),
                ),
                Cell::from(th.phase.name()).style(t.fg(t.phase_color(th.phase))),
                Cell::from(format!("{:?}", th.state).to_lowercase()).style(state_style),
                Cell::from(format!("{:.1}", w.steps_per_s())),
                Cell::from(format!("{:.1}", w.step_ms())),
            ])
        })
        .collect();
    if show_groups {
        for g in &c.snap.groups {
            rows.push(
                Row::new(vec![
                    Cell::from(format!("{} x{}", g.name, g.count)),
                    Cell::from("other"),
                    Cell::from(""),
                    Cell::from(format!("{:.0}", g.cpu_pct)),
                    Cell::from(""),
                    Cell::from(""),
                    Cell::from(""),
                    Cell::from(""),
                ])
                .style(t.dim()),
            );
        }
    }
    let widths = if full {
        vec![
            Constraint::Min(14),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Length(12),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(8),
        ]
    } else {
        // thread, cpu%, phase, state, ms/step
        vec![
            Constraint::Min(10),
            Constraint::Length(0),
            Constraint::Length(0),
            Constraint::Length(4),
            Constraint::Length(12),
            Constraint::Length(7),
            Constraint::Length(0),
            Constraint::Length(7),
        ]
    };
    let title = match &c.snap.cpu_note {
        Some(n) => format!(" threads ({n}) "),
        None => " threads ".to_string(),
    };
    let table = Table::new(rows, widths)
        .column_spacing(1)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(title));
    f.render_widget(table, area);
}
