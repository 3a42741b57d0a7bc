//! The timeline's cells (src/tui/panels/timeline.rs): the phases' colours and glyphs looked up
//! once a frame (`Palette`), a lane drawn straight into the buffer two half-columns a cell, the
//! legend's swatches, and a queue's depth as an eighth-block.

use crate::telemetry::{Phase, N_PHASES};
use crate::tui::theme::Theme;
use ratatui::buffer::Buffer;
use ratatui::style::{Color, Style};

/// The phases' colours and which of them are waits, looked up once a frame (a lane has
/// hundreds of cells, each of two phases).
pub struct Palette {
    theme: Theme,
    colors: [Color; N_PHASES],
    waits: [bool; N_PHASES],
}

impl Palette {
    /// The palette of `theme` (`Theme::for_names` says which declared phases are waits).
    pub fn new(theme: Theme) -> Palette {
        Palette {
            theme,
            colors: std::array::from_fn(|i| theme.phase_color(Phase::ALL[i])),
            waits: std::array::from_fn(|i| theme.is_wait(Phase::ALL[i])),
        }
    }

    /// Lane columns a cell holds: two half-columns where colour can tell them apart, else one.
    pub fn halves(&self) -> usize {
        if self.theme.color {
            2
        } else {
            1
        }
    }

    /// The cell of a lane. With colour a cell holds two half-columns, `a` left and `b` right (a
    /// half block in `a`'s colour on `b`'s); a column of one wait phase is hatched, so a
    /// starving lane reads as hollow. Without colour, the glyph of the phase of the left half.
    pub fn cell(&self, a: Option<Phase>, b: Option<Phase>) -> Option<(char, Style)> {
        let theme = self.theme;
        if !theme.color {
            let p = a.or(b)?;
            return Some(theme.phase_cell(p));
        }
        let color = |p: Phase| self.colors[p.index()];
        Some(match (a, b) {
            (Some(a), Some(b)) if a == b => {
                let ch = if self.waits[a.index()] { '▒' } else { '█' };
                (ch, theme.fg(color(a)))
            }
            (Some(a), Some(b)) => ('▌', Style::default().fg(color(a)).bg(color(b))),
            (Some(a), None) => ('▌', theme.fg(color(a))),
            (None, Some(b)) => ('▐', theme.fg(color(b))),
            (None, None) => return None,
        })
    }
}

/// Draws a lane's columns from `(x, y)`, `rows` rows high: two half-columns a cell with colour,
/// one without. Writes the buffer's cells directly (no lookup per cell, one style per pair of
/// phases in a row).
pub fn draw_lane(
    buf: &mut Buffer,
    x: u16,
    y: u16,
    rows: u16,
    columns: &[Option<Phase>],
    palette: &Palette,
) {
    let halves = palette.halves();
    let area = buf.area;
    if x >= area.right() || y >= area.bottom() {
        return;
    }
    let rows = rows.min(area.bottom() - y) as usize;
    let stride = area.width as usize;
    let start = buf.index_of(x, y);
    let width = (area.right() - x) as usize;
    // The previous cell's two phases and what they drew: runs of a phase look up once.
    let mut last = None;
    let mut drawn = None;
    for (i, pair) in columns.chunks(halves).take(width).enumerate() {
        let key = Some((pair[0], *pair.last().unwrap_or(&None)));
        if key != last {
            (last, drawn) = (key, key.and_then(|(a, b)| palette.cell(a, b)));
        }
        if let Some((ch, style)) = drawn {
            for dy in 0..rows {
                buf.content[start + dy * stride + i]
                    .set_char(ch)
                    .set_style(style);
            }
        }
    }
}

/// The legend's swatch of a phase.
pub(super) fn swatch(palette: &Palette, p: Phase) -> (char, Style) {
    palette
        .cell(Some(p), Some(p))
        .unwrap_or((' ', Style::default()))
}

/// A queue's depth as an eighth-block: empty a dot, full a solid block in the blocked style.
pub(super) fn depth_cell(theme: Theme, share: f64) -> (char, Style) {
    const LEVELS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if share <= 0.0 {
        ('·', theme.dim())
    } else if share >= 1.0 {
        ('█', theme.blocked())
    } else {
        let i = ((share * 8.0).ceil() as usize).clamp(1, 8) - 1;
        (LEVELS[i], theme.accent(ratatui::style::Color::Cyan))
    }
}
