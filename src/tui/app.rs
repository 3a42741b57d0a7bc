//! Front-end state, the `Action` every key becomes, and the one `update` that changes state.
//! No terminal here: tests drive it directly.

use crate::telemetry::snapshot::StepSpan;
use crate::telemetry::{GpuTiming, Snapshot};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Overview,
    Threads,
    Phases,
    Queues,
    Charts,
}

impl View {
    pub const ALL: [View; 5] = [
        View::Overview,
        View::Threads,
        View::Phases,
        View::Queues,
        View::Charts,
    ];

    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "1 overview",
            View::Threads => "2 threads",
            View::Phases => "3 phases",
            View::Queues => "4 queues+gpu",
            View::Charts => "5 charts",
        }
    }

    fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }
}

/// Which rolling window the phase bars show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    OneSecond,
    TenSeconds,
    Run,
}

impl Window {
    pub fn name(self) -> &'static str {
        match self {
            Window::OneSecond => "1s",
            Window::TenSeconds => "10s",
            Window::Run => "run",
        }
    }
}

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
        KeyCode::Char(c @ '1'..='5') => Action::ShowView(c as usize - '1' as usize),
        _ => return None,
    })
}

/// What the front-end can ask of the engine. Replays implement it as "not available".
pub trait Controls {
    fn profiling(&self) -> bool;
    fn set_profiling(&self, on: bool);
    fn gpu_timing(&self) -> GpuTiming;
    fn set_gpu_timing(&self, mode: GpuTiming);
    fn paused(&self) -> bool;
    fn set_paused(&self, paused: bool);
    fn reset_windows(&self);
    fn checkpoint(&self) -> Result<(), String>;
    /// Whether these controls reach a live engine (false in replay).
    fn live(&self) -> bool;
    /// Whether quitting stops that engine (false for an attached viewer: it only detaches, so
    /// `q` needs no second press).
    fn quit_stops_run(&self) -> bool {
        self.live()
    }
}

pub struct App {
    pub view: View,
    pub window: Window,
    pub help: bool,
    pub quit: bool,
    /// The snapshot on screen while frozen.
    pub frozen: Option<Arc<Snapshot>>,
    pub latest: Option<Arc<Snapshot>>,
    /// A short note about the last key (shown in the header).
    pub note: Option<String>,
    /// Step spans of the last `TRACE_SECONDS`, for `e`.
    pub recent: std::collections::VecDeque<StepSpan>,
    /// Snapshots the hub published that this front-end never got (gaps in `seq`).
    pub missed_snapshots: u64,
    /// `q` was pressed once on a live run: the next `q` stops training.
    pub quit_armed: bool,
    /// The engine stopped by itself (run finished or failed): `q` leaves at once.
    pub finished: bool,
}

/// What `e` exports: the last seconds of phases.
pub const TRACE_SECONDS: f64 = 10.0;

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl App {
    pub fn new() -> App {
        App {
            view: View::Overview,
            window: Window::OneSecond,
            help: false,
            quit: false,
            frozen: None,
            latest: None,
            note: None,
            recent: std::collections::VecDeque::new(),
            missed_snapshots: 0,
            quit_armed: false,
            finished: false,
        }
    }

    /// The snapshot to render.
    pub fn shown(&self) -> Option<&Arc<Snapshot>> {
        self.frozen.as_ref().or(self.latest.as_ref())
    }

    pub fn on_snapshot(&mut self, s: Arc<Snapshot>) {
        // A new line from the engine (a saved checkpoint, …) replaces the last key's note.
        let previous = self.latest.as_ref().and_then(|l| l.status.as_ref());
        if s.status.is_some() && s.status.as_ref() != previous {
            self.note = None;
        }
        if let Some(prev) = &self.latest {
            self.missed_snapshots += s.seq.saturating_sub(prev.seq + 1);
        }
        self.recent.extend(s.steps.iter().cloned());
        if let Some(end) = self.recent.back().map(|x| x.end_ns) {
            let from = end.saturating_sub((TRACE_SECONDS * 1e9) as u64);
            while self.recent.front().is_some_and(|x| x.end_ns < from) {
                self.recent.pop_front();
            }
        }
        self.latest = Some(s);
    }

    pub fn update(&mut self, action: Action, ctl: &dyn Controls) {
        let engine_only = |app: &mut App| {
            if !ctl.live() {
                app.note = Some("replay: the engine cannot be changed".into());
                return false;
            }
            true
        };
        let armed = std::mem::take(&mut self.quit_armed);
        match action {
            Action::Quit if armed || !ctl.quit_stops_run() || self.finished => self.quit = true,
            Action::Quit => {
                self.quit_armed = true;
                self.note = Some("q again to stop training (the run saves as configured)".into());
            }
            Action::QuitNow => self.quit = true,
            Action::Back => {
                if self.help {
                    self.help = false;
                } else {
                    self.note = Some("nothing to close (q quits)".into());
                }
            }
            Action::ToggleProfiling => {
                if engine_only(self) {
                    let on = !ctl.profiling();
                    ctl.set_profiling(on);
                    self.note = Some(format!("profiling {}", if on { "on" } else { "off" }));
                }
            }
            Action::CycleGpuTiming => {
                if engine_only(self) {
                    let mode = ctl.gpu_timing().next();
                    ctl.set_gpu_timing(mode);
                    self.note = Some(format!("GPU timing: {}", mode.name()));
                }
            }
            Action::TogglePause => {
                if engine_only(self) {
                    let p = !ctl.paused();
                    ctl.set_paused(p);
                    self.note = Some(
                        if p {
                            "training paused"
                        } else {
                            "training resumed"
                        }
                        .into(),
                    );
                }
            }
            Action::ToggleFreeze => {
                self.frozen = match self.frozen.take() {
                    Some(_) => None,
                    None => self.latest.clone(),
                };
                self.note = Some(
                    if self.frozen.is_some() {
                        "display frozen"
                    } else {
                        "display live"
                    }
                    .into(),
                );
            }
            Action::ResetWindows => {
                ctl.reset_windows();
                self.note = Some("windows reset".into());
            }
            Action::Checkpoint => {
                if engine_only(self) {
                    self.note = Some(match ctl.checkpoint() {
                        Ok(()) => "checkpoint requested".into(),
                        Err(why) => why,
                    });
                }
            }
            Action::NextView => self.view = View::ALL[(self.view.index() + 1) % View::ALL.len()],
            Action::PrevView => {
                self.view = View::ALL[(self.view.index() + View::ALL.len() - 1) % View::ALL.len()]
            }
            Action::ShowView(i) => {
                if let Some(v) = View::ALL.get(i) {
                    self.view = *v;
                }
            }
            Action::ToggleHelp => self.help = !self.help,
            Action::ExportTrace => {
                let spans: Vec<StepSpan> = self.recent.iter().cloned().collect();
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let path = std::path::PathBuf::from(format!("dflash-top-trace-{stamp}.json"));
                self.note = Some(if spans.is_empty() {
                    "no steps to trace yet".to_string()
                } else {
                    match crate::telemetry::trace::write_trace(&path, &spans) {
                        Ok(()) => {
                            format!("trace of the last {TRACE_SECONDS:.0} s: {}", path.display())
                        }
                        Err(e) => format!("{e:#}"),
                    }
                });
            }
            Action::CycleWindow => {
                self.window = match self.window {
                    Window::OneSecond => Window::TenSeconds,
                    Window::TenSeconds => Window::Run,
                    Window::Run => Window::OneSecond,
                };
                self.note = Some(format!("phase window: {}", self.window.name()));
            }
        }
    }
}
