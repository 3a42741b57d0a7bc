//! The help overlay: every key.

use super::super::view::Ctx;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

pub const KEYS: [(&str, &str); 20] = [
    (
        "p",
        "profiling on/off (steps, tokens and loss are always counted)",
    ),
    (
        "g",
        "GPU timing: async (host wall) / events (device time) / sync (stream synced)",
    ),
    ("space", "pause / resume training (a replay: its playback)"),
    ("f", "freeze / unfreeze the display"),
    (
        "r",
        "reset the 1s/10s windows, the run window's phase times, the verdict",
    ),
    ("w", "phase window: 1s / 10s / run"),
    ("c", "save a checkpoint now (needs --save-dir)"),
    (
        "e",
        "export the timeline's span of phases as a Chrome trace (Perfetto)",
    ),
    ("tab l →", "next view (shift-tab, h, ←: previous)"),
    (
        "1-7",
        "overview, threads, phases, queues+GPUs, charts, timeline, warnings",
    ),
    ("t", "the timeline"),
    ("j k ↓ ↑", "select the next / previous thread"),
    (
        "s",
        "sort threads: pipeline / cpu / state / ms per step / name",
    ),
    (
        "+ - [ ]",
        "timeline: zoom in / out, pan earlier / later (freezes)",
    ),
    (
        "< > ← →",
        "replay: seek 10 s back / forward (arrows: views when live)",
    ),
    (", .", "replay: slower / faster (1x 2x 4x max)"),
    ("?", "this help"),
    (
        "q",
        "quit (a live run asks once: q again stops it, saves, restores the terminal)",
    ),
    ("ctrl-c", "quit at once (the run still saves)"),
    ("esc", "close this help or clear the selection; never quits"),
];

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    let w = 72.min(area.width);
    let extra = c.app.keys.described.len() as u16;
    let h = (KEYS.len() as u16 + extra + 4).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    // No GPU worker: `g` does nothing there, so it is not listed.
    let no_gpu = c.snap.gpu_timing.is_none();
    let keys = KEYS.iter().filter(|(k, _)| !(no_gpu && *k == "g"));
    let mut lines: Vec<Line> = keys
        .map(|(k, d)| Line::from(format!(" {k:>7}  {d}")))
        .collect();
    for (k, action) in &c.app.keys.described {
        lines.push(Line::from(format!(" {k:>7}  {action} (ui.toml)")));
    }
    lines.push(Line::from(""));
    lines.push(Line::styled(" press ? or esc to close", c.theme.dim()));
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(" keys ")),
        r,
    );
}
