//! Threads: name, role, device, CPU % per OS thread, current phase, state, the kernel's state
//! letter; libtorch's own threads under the worker that drives them, the other unregistered ones
//! grouped by name at the end.

use super::super::choices::Sort;
use super::Ctx;
use crate::telemetry::owner::comm_of;
use crate::telemetry::snapshot::{ThreadGroupView, ThreadState, ThreadView};
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Cell, Row, Table, TableState};
use ratatui::Frame;

/// Rows the table wants in the threads view: borders, the header, a row a thread and a row a
/// group of helper threads.
pub fn height(c: &Ctx) -> u16 {
    3 + (c.snap.threads.len() + c.snap.groups.len()) as u16
}

/// `full`: every column and libtorch's own threads (the threads view); otherwise the compact
/// columns that fit beside the phase bars. Threads in the chosen order; the selected one
/// highlighted and kept on screen.
pub fn render(f: &mut Frame, area: Rect, c: &Ctx, full: bool) {
    // The columns shown: all of them in the threads view; beside the phase bars, those that
    // fit whole.
    let longest = c.snap.threads.iter().map(|t| t.name.chars().count()).max();
    let keep = columns(area.width.saturating_sub(2), full, longest.unwrap_or(0));
    let (rows, names, selected_row) = body(c, &keep, full);
    let widths: Vec<Constraint> = keep.iter().map(|k| k.1).collect();
    let table = Table::new(rows, widths)
        .column_spacing(1)
        .header(header(c, &keep))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
        .block(Block::default().borders(Borders::ALL).title(title(c, full)));
    let mut state = TableState::default().with_selected(selected_row);
    f.render_stateful_widget(table, area, &mut state);
    record_hits(c, area, &names, state.offset());
}

/// The cells of the columns kept, in `keep`'s order.
fn pick(keep: &[(usize, Constraint)], cells: Vec<Cell<'static>>) -> Vec<Cell<'static>> {
    let mut cells: Vec<Option<Cell>> = cells.into_iter().map(Some).collect();
    keep.iter().filter_map(|(i, _)| cells[*i].take()).collect()
}

/// The header row, the sort's column marked `▼`.
fn header(c: &Ctx, keep: &[(usize, Constraint)]) -> Row<'static> {
    let mark = |s: Sort, name: &'static str| -> String {
        if c.app.sort == s {
            format!("{name}▼")
        } else {
            name.to_string()
        }
    };
    Row::new(pick(
        keep,
        vec![
            mark(Sort::Name, "thread"),
            "role".into(),
            "dev".into(),
            mark(Sort::Cpu, "cpu%"),
            "phase".into(),
            mark(Sort::State, "state"),
            "os".into(),
            "step/s".into(),
            mark(Sort::MsPerStep, "ms/step"),
        ]
        .into_iter()
        .map(Cell::from)
        .collect(),
    ))
    .style(c.theme.bold())
}

/// The rows: a thread each in the chosen order, with (`full`) its helper threads' groups under
/// it and the unowned groups at the end. With the thread each row shows (None: a group of
/// helper threads), for clicks, and the selected thread's row.
fn body(
    c: &Ctx,
    keep: &[(usize, Constraint)],
    full: bool,
) -> (Vec<Row<'static>>, Vec<Option<String>>, Option<usize>) {
    let t = c.theme;
    let show_groups = full;
    let mut rows: Vec<Row> = Vec::new();
    let mut names: Vec<Option<String>> = Vec::new();
    let mut selected_row = None;
    for th in c.app.ordered_threads(c.snap) {
        if c.app.selected.as_ref() == Some(&th.name) {
            selected_row = Some(rows.len());
        }
        names.push(Some(th.name.clone()));
        rows.push(Row::new(pick(keep, thread_cells(c, th, full))));
        if show_groups {
            let helpers = c
                .snap
                .groups
                .iter()
                .filter(|g| g.owner.as_ref() == Some(&th.name));
            rows.extend(helpers.map(|g| Row::new(pick(keep, group_cells(g))).style(t.dim())));
        }
        names.resize(rows.len(), None);
    }
    if show_groups {
        let others = c.snap.groups.iter().filter(|g| g.owner.is_none());
        rows.extend(others.map(|g| Row::new(pick(keep, group_cells(g))).style(t.dim())));
    }
    (rows, names, selected_row)
}

/// A thread's cells, every column.
fn thread_cells(c: &Ctx, th: &ThreadView, full: bool) -> Vec<Cell<'static>> {
    let t = c.theme;
    let off = c.profiling_off().is_some();
    let w = c.window_of(th);
    let state_style = match th.state {
        ThreadState::Waiting => t.attention(),
        ThreadState::Exited => t.dim(),
        ThreadState::Working => t.ok(),
    };
    // Profiling off: no phase is marked, so the state is the kernel's (still read) and
    // a window with no phase time has no ms/step to show.
    let (phase, state) = if off && th.state != ThreadState::Exited {
        (
            Cell::from("off").style(t.dim()),
            Cell::from(match full {
                true => os_word(th.os_state),
                false => os_short(th.os_state),
            }),
        )
    } else {
        (
            Cell::from(c.snap.names.phase(th.phase).to_string())
                .style(t.fg(t.phase_color(th.phase))),
            Cell::from(format!("{:?}", th.state).to_lowercase()).style(state_style),
        )
    };
    let ms = if off && w.wall_ns == 0 {
        "–".to_string()
    } else {
        format!("{:.1}", w.step_ms())
    };
    vec![
        Cell::from(th.name.clone()).style(c.name_style(&th.name, Style::default())),
        Cell::from(c.snap.names.role(th.role).to_string()),
        Cell::from(th.device.clone()),
        Cell::from(
            th.cpu_pct
                .map(|x| format!("{x:.0}"))
                .unwrap_or_else(|| "-".into()),
        ),
        phase,
        state,
        Cell::from(th.os_state.map(String::from).unwrap_or_else(|| "-".into())),
        Cell::from(format!("{:.1}", w.steps_per_s())),
        Cell::from(ms),
    ]
}

/// The table's title: the CPU note; in the threads view the sort, the keys, where the state
/// comes from with profiling off, and the memory.
fn title(c: &Ctx, full: bool) -> String {
    let mut title = match &c.snap.cpu_note {
        Some(n) => format!(" threads ({n}) "),
        None => " threads ".to_string(),
    };
    if full {
        title.push_str(&format!("· sort {} (s) · j/k select ", c.app.sort.name()));
        if let Some(off) = c.profiling_off() {
            title.push_str(&format!("· {off}: state from the kernel "));
        }
    }
    if let (Some(m), true) = (&c.snap.memory, full) {
        title.push_str(&format!(
            "· rss {} MiB · host {}/{} GiB ",
            m.rss_mib,
            m.host_used_mib / 1024,
            m.host_total_mib / 1024
        ));
    }
    title
}

/// Records the screen row of each thread shown, from the table's scroll `offset`, for clicks.
fn record_hits(c: &Ctx, area: Rect, names: &[Option<String>], offset: usize) {
    // Borders and the header above the first row shown.
    let first_y = area.y + 2;
    let last_y = area.y + area.height.saturating_sub(1);
    let mut hits = c.app.hits.borrow_mut();
    for (i, name) in names.iter().enumerate().skip(offset) {
        let y = first_y + (i - offset) as u16;
        if y >= last_y {
            break;
        }
        if let Some(n) = name {
            hits.push((y, n.clone()));
        }
    }
}

/// The table's columns at `width`: the thread's name, then whole columns by how much they say
/// (beside the phase bars: ms/step, state, cpu%, os, phase; in the threads view: phase, state,
/// ms/step, cpu%, os, step/s, role, dev); one that does not fit is left out, never cut. The
/// name's column grows a little for longer names (a merged view's `r1/drafter-0`).
fn columns(width: u16, full: bool, longest: usize) -> Vec<(usize, Constraint)> {
    // (column index, width) in the order they are given room: beside the phase bars what
    // they do not say; in the threads view every column, the phase first.
    const COMPACT: [(usize, u16); 5] = [(8, 7), (5, 7), (3, 4), (6, 2), (4, 12)];
    const FULL: [(usize, u16); 8] = [
        (4, 12),
        (5, 8),
        (8, 8),
        (3, 5),
        (6, 5),
        (7, 7),
        (1, 7),
        (2, 7),
    ];
    let (name, want): (u16, &[(usize, u16)]) = if full { (16, &FULL) } else { (10, &COMPACT) };
    let mut keep = vec![(0, Constraint::Min(name))];
    let mut used = name;
    for &(i, cw) in want {
        if used + 1 + cw <= width {
            keep.push((i, Constraint::Length(cw)));
            used += 1 + cw;
        }
    }
    // Beside the bars, a name that would be cut (a merged view's `r1/drafter-0`) takes the
    // room of the `os` column rather than lose its last characters.
    let short = (longest as u16).saturating_sub(name + width.saturating_sub(used));
    if !full && short > 0 {
        if let Some(at) = keep.iter().position(|k| k.0 == 6) {
            keep.remove(at);
            used -= 3;
        }
    }
    keep.sort_by_key(|k| k.0);
    let name = name
        + (longest as u16)
            .saturating_sub(name)
            .min(width.saturating_sub(used));
    keep[0].1 = if full {
        Constraint::Length(name)
    } else {
        Constraint::Min(name)
    };
    keep
}

fn group_cells(g: &ThreadGroupView) -> Vec<Cell<'static>> {
    let (name, role) = match &g.owner {
        Some(owner) if comm_of(owner) == g.name => (format!(" ↳ intra-op x{}", g.count), "pool"),
        Some(_) if g.name.starts_with("pt_autograd_") => {
            (format!(" ↳ {} x{}", g.name, g.count), "autograd")
        }
        Some(_) => (format!(" ↳ {} x{}", g.name, g.count), "helper"),
        None => (format!("{} x{}", g.name, g.count), "other"),
    };
    vec![
        Cell::from(name),
        Cell::from(role),
        Cell::from(""),
        Cell::from(format!("{:.0}", g.cpu_pct)),
        Cell::from(""),
        Cell::from(""),
        Cell::from(states(&g.states)),
        Cell::from(""),
        Cell::from(""),
    ]
}

/// A thread's state as the kernel reports it (profiling off: no phase says more).
pub fn os_word(state: Option<char>) -> &'static str {
    match state {
        Some('R') => "running",
        Some('S') => "asleep",
        Some('D') => "io-wait",
        Some('T') | Some('t') => "stopped",
        Some('Z') | Some('X') => "exited",
        Some('I') => "idle",
        _ => "–",
    }
}

/// `os_word` in at most four letters (the compact table beside the phase bars).
pub fn os_short(state: Option<char>) -> &'static str {
    match os_word(state) {
        "running" => "run",
        "asleep" => "slp",
        "io-wait" => "io",
        "stopped" => "stop",
        "exited" => "gone",
        w => w,
    }
}

/// `R1S3`: how many threads of a group are in each kernel state.
pub fn states(s: &[(char, usize)]) -> String {
    s.iter().map(|(c, n)| format!("{c}{n}")).collect()
}
