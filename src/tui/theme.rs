//! Colours and glyphs. Every phase has one colour everywhere; with NO_COLOR set, phases are told
//! apart by their fill glyph instead. A light palette for light terminals, and a colour per phase
//! from the UI settings file (tui/settings.rs).

use crate::telemetry::names::Names;
use crate::telemetry::verdict::Verdict;
use crate::telemetry::{Phase, N_PHASES};
use ratatui::style::{Color, Modifier, Style};

/// What a header badge says about the run's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Badge {
    Normal,
    Attention,
    Info,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
    /// Colours that read on a light background (no white, light yellow or light cyan).
    pub light: bool,
    /// Colours the UI config sets per phase.
    pub phase: [Option<Color>; N_PHASES],
    /// The declared phases that are waits, a bit per custom slot, as the names of the pipeline
    /// drawn say (`for_names`).
    pub declared_waits: u16,
}

impl Default for Theme {
    fn default() -> Self {
        Theme::from_color(true)
    }
}

impl Theme {
    /// The dark palette, in colour or not.
    pub fn from_color(color: bool) -> Theme {
        Theme {
            color,
            light: false,
            phase: [None; N_PHASES],
            declared_waits: 0,
        }
    }

    /// This theme for drawing a pipeline of `names`: its declared waits drawn as waits.
    pub fn for_names(self, names: &Names) -> Theme {
        let declared_waits = Phase::ALL
            .iter()
            .filter_map(|p| p.custom_slot().filter(|_| names.is_wait(*p)))
            .fold(0u16, |bits, slot| bits | 1 << slot);
        Theme {
            declared_waits,
            ..self
        }
    }

    /// Whether `p` is drawn as a wait: a built-in wait, or a declared one (`for_names`).
    pub fn is_wait(self, p: Phase) -> bool {
        p.is_wait() || self.is_declared_wait(p)
    }

    fn is_declared_wait(self, p: Phase) -> bool {
        p.custom_slot()
            .is_some_and(|slot| self.declared_waits >> slot & 1 == 1)
    }

    /// Colour unless NO_COLOR is set to a non-empty value (no-color.org).
    pub fn from_env() -> Theme {
        Theme::from_color(std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
    }

    pub fn phase_color(self, p: Phase) -> Color {
        if let Some(c) = self.phase[p.index()] {
            return c;
        }
        self.on_background(self.dark_phase_color(p))
    }

    /// A colour of the dark palette as drawn on this theme's background: on a light one the
    /// light variants and yellow wash out, so their darker kin instead (text in them readable
    /// on white: yellow as brown, cyan as teal).
    pub fn on_background(self, c: Color) -> Color {
        if !self.light {
            return c;
        }
        match c {
            Color::White => Color::Black,
            Color::LightYellow => Color::Indexed(136),
            Color::Yellow => Color::Indexed(130),
            Color::LightCyan => Color::Indexed(30),
            Color::Cyan => Color::Indexed(31),
            Color::LightGreen => Color::Indexed(28),
            Color::LightMagenta => Color::Magenta,
            Color::DarkGray => Color::Indexed(245),
            Color::Indexed(180) => Color::Indexed(137),
            Color::Indexed(215) => Color::Indexed(166),
            c => c,
        }
    }

    fn dark_phase_color(self, p: Phase) -> Color {
        match p {
            Phase::Other => Color::DarkGray,
            Phase::Read => Color::Cyan,
            Phase::Pack => Color::LightCyan,
            // Waits in orange (attention, not a fault): on a full queue, on an empty one.
            Phase::PushWait => Color::Indexed(208),
            Phase::BatchWait => Color::Indexed(215),
            Phase::H2d => Color::Magenta,
            Phase::Forward => Color::Blue,
            Phase::HsPack => Color::LightMagenta,
            Phase::HsPushWait => Color::Indexed(208),
            Phase::HsWait => Color::Indexed(215),
            Phase::Anchors => Color::Yellow,
            // Not anchors' yellow's light kin: a pink, told apart in the drafter's bar.
            Phase::Loss => Color::Indexed(205),
            Phase::Backward => Color::Green,
            // Not the light kin of backward's green and forward's blue: a tan and a violet,
            // told apart from their neighbours in a bar at a glance.
            Phase::Clip => Color::Indexed(180),
            Phase::Optim => Color::Indexed(135),
            Phase::Metrics => Color::White,
            Phase::GradSync => Color::Indexed(100),
            // Declared phases (a client's own names): waits orange, the rest a palette of their own.
            p if self.is_declared_wait(p) => Color::Indexed(215),
            p => {
                let palette = [
                    Color::Blue,
                    Color::Green,
                    Color::Yellow,
                    Color::Cyan,
                    Color::Magenta,
                    Color::LightGreen,
                ];
                palette[p.custom_slot().unwrap_or(0) % palette.len()]
            }
        }
    }

    /// The bar cell of a phase: a coloured block, or a glyph of its own without colour.
    pub fn phase_cell(self, p: Phase) -> (char, Style) {
        if self.color {
            ('█', Style::default().fg(self.phase_color(p)))
        } else {
            let glyphs = [
                '·', 'r', 'p', '!', '?', 'h', 'F', 's', '#', '~', 'a', 'L', 'B', 'c', 'O', 'm',
                'S', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'x', 'y',
            ];
            (glyphs[p.index()], Style::default())
        }
    }

    /// Text or a mark in one of the front-end's own colours (a colour of the dark palette,
    /// drawn as `on_background` says).
    pub fn accent(self, c: Color) -> Style {
        self.fg(self.on_background(c))
    }

    pub fn fg(self, c: Color) -> Style {
        if self.color {
            Style::default().fg(c)
        } else {
            Style::default()
        }
    }

    pub fn bold(self) -> Style {
        Style::default().add_modifier(Modifier::BOLD)
    }

    /// A fault (a stall, dropped records, an error): red, or reversed without colour. Red
    /// means this and nothing else.
    pub fn alert(self) -> Style {
        if self.color {
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)
        } else {
            Style::default().add_modifier(Modifier::REVERSED)
        }
    }

    /// Worth a look, not a fault (a thread waiting, a queue that starves or blocks, a state
    /// the user chose: paused, frozen, profiling off): yellow, or underlined without colour.
    pub fn attention(self) -> Style {
        if self.color {
            self.accent(Color::Yellow)
        } else {
            Style::default().add_modifier(Modifier::UNDERLINED)
        }
    }

    /// A queue whose consumers starve (waiting on empty): yellow and bold (the `▽` says which).
    pub fn starved(self) -> Style {
        self.attention().add_modifier(Modifier::BOLD)
    }

    /// A queue whose producers are blocked (waiting on full): yellow (the `△` says which).
    pub fn blocked(self) -> Style {
        self.attention()
    }

    /// A verdict: balanced green; a stage that is the slower one (loader-, target-,
    /// drafter-bound) is the pipeline's normal state, in plain bold; paused yellow; stalled
    /// red; warming up dim.
    pub fn verdict(self, v: Verdict) -> Style {
        match v {
            Verdict::Balanced => self.ok(),
            Verdict::Warmup => self.dim(),
            Verdict::Paused => self.attention(),
            Verdict::Stalled => self.alert(),
            _ => self.bold(),
        }
    }

    /// A state badge (`RUNNING`, `PAUSED`, …): reversed, in green (normal), yellow (a state
    /// chosen or worth a look) or cyan (information: a replay).
    pub fn badge(self, kind: Badge) -> Style {
        let c = match kind {
            Badge::Normal => Color::Green,
            Badge::Attention => Color::Yellow,
            Badge::Info => Color::Cyan,
        };
        self.accent(c).add_modifier(Modifier::REVERSED)
    }

    pub fn ok(self) -> Style {
        self.fg(Color::Green)
    }

    pub fn dim(self) -> Style {
        if self.color {
            Style::default().fg(if self.light {
                Color::Indexed(242)
            } else {
                Color::DarkGray
            })
        } else {
            Style::default()
        }
    }
}
