//! Keys: the `Action` each key becomes, the default bindings, and the bindings a UI config
//! adds on top (parsed in settings.rs). No state here: `App::update` applies the actions.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// `q`: leaves a replay or a finished run at once; a live run asks once.
    Quit,
    /// Ctrl-C: stops at once (gracefully: the pipeline saves and the terminal is restored).
    QuitNow,
    /// Esc: closes the help overlay; never quits.
    Back,
    ToggleProfiling,
    CycleGpuTiming,
    TogglePause,
    ToggleFreeze,
    ResetWindows,
    Checkpoint,
    NextView,
    PrevView,
    ShowView(usize),
    ToggleHelp,
    CycleWindow,
    ExportTrace,
    /// `j`/`↓` and `k`/`↑`: the next / previous thread.
    SelectNext,
    SelectPrev,
    /// `s`: the next sort order.
    CycleSort,
    ZoomIn,
    ZoomOut,
    /// `[` / `]`: the timeline earlier / later by a quarter of its width (freezes the display).
    PanBack,
    PanForward,
    /// `<` / `>` (and `←` / `→` in a replay): the replay 10 s back / forward.
    SeekBack,
    SeekForward,
    /// `,` / `.`: the replay slower / faster (1x, 2x, 4x, max).
    Slower,
    Faster,
}

/// Maps a key press to an action.
pub fn action_for(key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    Some(match key.code {
        KeyCode::Char('c') if ctrl => Action::QuitNow,
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Esc => Action::Back,
        KeyCode::Char('p') => Action::ToggleProfiling,
        KeyCode::Char('g') => Action::CycleGpuTiming,
        KeyCode::Char(' ') => Action::TogglePause,
        KeyCode::Char('f') => Action::ToggleFreeze,
        KeyCode::Char('r') => Action::ResetWindows,
        KeyCode::Char('c') => Action::Checkpoint,
        KeyCode::Char('w') => Action::CycleWindow,
        KeyCode::Char('e') => Action::ExportTrace,
        KeyCode::Tab | KeyCode::Right | KeyCode::Char('l') => Action::NextView,
        KeyCode::BackTab | KeyCode::Left | KeyCode::Char('h') => Action::PrevView,
        KeyCode::Char('?') => Action::ToggleHelp,
        KeyCode::Char(c @ '1'..='7') => Action::ShowView(c as usize - '1' as usize),
        KeyCode::Char('t') => Action::ShowView(super::choices::View::Timeline.index()),
        KeyCode::Down | KeyCode::Char('j') => Action::SelectNext,
        KeyCode::Up | KeyCode::Char('k') => Action::SelectPrev,
        KeyCode::Char('s') => Action::CycleSort,
        KeyCode::Char('+') | KeyCode::Char('=') => Action::ZoomIn,
        KeyCode::Char('-') | KeyCode::Char('_') => Action::ZoomOut,
        KeyCode::Char('[') => Action::PanBack,
        KeyCode::Char(']') => Action::PanForward,
        KeyCode::Char('<') => Action::SeekBack,
        KeyCode::Char('>') => Action::SeekForward,
        KeyCode::Char(',') => Action::Slower,
        KeyCode::Char('.') => Action::Faster,
        _ => return None,
    })
}

/// In a replay the arrows `←` / `→` seek (tab, shift-tab, `h`, `l` still change the view).
pub fn in_replay(key: KeyEvent, action: Action, replay: bool) -> Action {
    match (replay, key.code, action) {
        (true, KeyCode::Left, Action::PrevView) => Action::SeekBack,
        (true, KeyCode::Right, Action::NextView) => Action::SeekForward,
        _ => action,
    }
}

/// Keys bound in the file, checked before the defaults.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyMap {
    pub bound: Vec<(KeyCode, bool, Action)>,
    /// ("x", "quit"): what the help overlay lists under the defaults.
    pub described: Vec<(String, String)>,
}

impl KeyMap {
    pub fn action(&self, key: KeyEvent) -> Option<Action> {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        self.bound
            .iter()
            .find(|(code, c, _)| *code == key.code && *c == ctrl)
            .map(|b| b.2)
            .or_else(|| action_for(key))
    }
}

/// `x`, `ctrl-x`, `esc`, `tab`, `space`, `enter`, arrows, `pageup`/`pagedown`, `home`/`end`.
pub fn parse_key(s: &str) -> Option<(KeyCode, bool)> {
    let (ctrl, name) = match s.strip_prefix("ctrl-") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let code = match name {
        "esc" => KeyCode::Esc,
        "tab" => KeyCode::Tab,
        "space" => KeyCode::Char(' '),
        "enter" => KeyCode::Enter,
        "up" => KeyCode::Up,
        "down" => KeyCode::Down,
        "left" => KeyCode::Left,
        "right" => KeyCode::Right,
        "pageup" => KeyCode::PageUp,
        "pagedown" => KeyCode::PageDown,
        "home" => KeyCode::Home,
        "end" => KeyCode::End,
        _ => {
            let mut chars = name.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => KeyCode::Char(c),
                _ => return None,
            }
        }
    };
    Some((code, ctrl))
}
