//! The help overlay: the views, every key, and a glossary of every word on screen; two columns
//! where they fit, else one that j/k scroll.

use super::super::choices::View;
use super::super::glossary::{view_text, GLOSSARY};
use super::Ctx;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::Frame;

/// Width of one column of help: the term, then its meaning.
const COLUMN: u16 = 78;
/// Columns the term takes, with its margins.
const TERM: usize = 16;

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

/// The overlay's lines in one column: the views, the keys, then (`glossary`) the words on
/// screen. Term and meaning in columns.
fn lines<'a>(c: &Ctx, keys: bool, glossary: bool, width: u16) -> Vec<Line<'a>> {
    let t = c.theme;
    let mut out: Vec<Line> = Vec::new();
    let room = (width as usize).saturating_sub(TERM).max(20);
    let row = |k: &str, d: &str| -> Vec<Line<'a>> {
        wrap(d, room)
            .into_iter()
            .enumerate()
            .map(|(i, part)| {
                let k = if i == 0 { k } else { "" };
                Line::from(format!(" {k:>13}  {part}"))
            })
            .collect()
    };
    if keys {
        out.push(Line::styled(
            format!(" views (tab, 1-{})", View::ALL.len()),
            t.bold(),
        ));
        for v in View::ALL {
            out.extend(row(v.title(), view_text(v)));
        }
        out.push(Line::from(""));
        out.push(Line::styled(" keys", t.bold()));
        // No GPU worker: `g` does nothing there, so it is not listed.
        let no_gpu = c.snap.gpu_timing.is_none();
        for (k, d) in KEYS.iter().filter(|(k, _)| !(no_gpu && *k == "g")) {
            out.extend(row(k, d));
        }
        for (k, action) in &c.app.keys.described {
            out.extend(row(k, &format!("{action} (ui.toml)")));
        }
    }
    if glossary {
        for (section, words) in GLOSSARY {
            if !out.is_empty() {
                out.push(Line::from(""));
            }
            out.push(Line::styled(format!(" {section}"), t.bold()));
            for (k, d) in words {
                out.extend(row(k, d));
            }
        }
    }
    out
}

/// `text` in lines of at most `width` characters, broken between words.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = vec![String::new()];
    for word in text.split(' ') {
        let last = out.last_mut().expect("one line");
        let len = last.chars().count();
        if len == 0 {
            last.push_str(word);
        } else if len + 1 + word.chars().count() <= width {
            last.push(' ');
            last.push_str(word);
        } else {
            out.push(word.to_string());
        }
    }
    out
}

pub fn render(f: &mut Frame, area: Rect, c: &Ctx) {
    // Two columns where they fit (keys | words), else one that j/k scroll.
    let two = area.width >= 2 * COLUMN + 4;
    let col = if two {
        ((area.width - 4) / 2).min(COLUMN + 24)
    } else {
        COLUMN.min(area.width.saturating_sub(2))
    };
    let w = if two { 2 * col + 3 } else { col + 2 };
    let (left, right) = if two {
        (lines(c, true, false, col), lines(c, false, true, col))
    } else {
        (lines(c, true, true, col), Vec::new())
    };
    let content = left.len().max(right.len()) as u16;
    let h = (content + 2).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    let inner_h = h.saturating_sub(2);
    let max = content.saturating_sub(inner_h);
    c.app.help_max.set(max);
    let scroll = c.app.help_scroll.min(max);
    let more = content > inner_h;
    let title = if more {
        format!(
            " help · j/k ↓ ↑ scroll ({}-{} of {}) · ? or esc closes ",
            scroll + 1,
            (scroll + inner_h).min(content),
            content
        )
    } else {
        " help · ? or esc closes ".to_string()
    };
    f.render_widget(Clear, r);
    let block = Block::default().borders(Borders::ALL).title(title);
    let inner = block.inner(r);
    f.render_widget(block, r);
    let [a, b] = if two {
        Layout::horizontal([Constraint::Length(col + 1), Constraint::Min(0)]).areas(inner)
    } else {
        [inner, Rect::default()]
    };
    f.render_widget(Paragraph::new(left).scroll((scroll, 0)), a);
    if two {
        f.render_widget(Paragraph::new(right).scroll((scroll, 0)), b);
    }
}
