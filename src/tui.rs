//! The live front-end: one event enum, one loop, a capped redraw rate; keys become actions and
//! `App::update` applies them; frames are drawn from the latest immutable snapshot only.

pub mod app;
pub mod choices;
pub mod controls;
pub mod critical;
pub mod glossary;
pub mod history;
pub mod keys;
pub mod lanes;
pub mod panels;
pub mod segments;
pub mod settings;
pub mod terminal;
pub mod theme;
pub mod verdict_row;
pub mod view;

use crate::telemetry::{GpuTiming, HubCommand, Snapshot, Switches, Telemetry};
use app::App;
use controls::Controls;
use crossbeam_channel::{never, select, tick, unbounded, Receiver};
use crossterm::event::{self, Event};
use panels::Badges;
use ratatui::backend::Backend;
use ratatui::Terminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use theme::Theme;

/// Redraw period: 10 frames a second, plus one right after each key.
pub const FRAME: Duration = Duration::from_millis(100);

/// The live engine's controls: every change goes to the hub as a `HubCommand` (one control
/// path); the state shown is what was last asked for, so a key shows its effect at once, then
/// what the switches say.
pub struct EngineControls {
    pub switches: Arc<Switches>,
    pub telemetry: Telemetry,
    pub can_save: bool,
    /// The engine is another process this viewer is attached to: quitting detaches.
    pub attached: bool,
    /// What the header's fourth row says of the processes watched: `attached to PID 1234
    /// (python) since 14:03:12`, or a job's ranks on this host's screen.
    pub attached_label: Option<String>,
    asked: std::sync::Mutex<Asked>,
}

/// What the front-end last asked for, until the hub has applied it.
#[derive(Default)]
struct Asked {
    profiling: Option<bool>,
    gpu_timing: Option<GpuTiming>,
    paused: Option<bool>,
}

impl EngineControls {
    pub fn new(telemetry: &Telemetry, can_save: bool) -> EngineControls {
        EngineControls {
            switches: telemetry.switches().clone(),
            telemetry: telemetry.clone(),
            can_save,
            attached: false,
            attached_label: None,
            asked: Default::default(),
        }
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, Asked> {
        self.asked.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The value asked for until the switch shows it, then the switch.
fn shown<T: PartialEq + Copy>(asked: &mut Option<T>, now: T) -> T {
    match *asked {
        Some(v) if v != now => v,
        _ => {
            *asked = None;
            now
        }
    }
}

impl Controls for EngineControls {
    fn profiling(&self) -> bool {
        shown(&mut self.asked().profiling, self.switches.profiling())
    }
    fn set_profiling(&self, on: bool) {
        self.asked().profiling = Some(on);
        self.telemetry.command(HubCommand::SetProfiling(on))
    }
    fn gpu_timing(&self) -> GpuTiming {
        shown(&mut self.asked().gpu_timing, self.switches.gpu_timing())
    }
    fn set_gpu_timing(&self, mode: GpuTiming) {
        self.asked().gpu_timing = Some(mode);
        self.telemetry.command(HubCommand::SetGpuTiming(mode))
    }
    fn paused(&self) -> bool {
        shown(&mut self.asked().paused, self.switches.paused())
    }
    fn set_paused(&self, paused: bool) {
        self.asked().paused = Some(paused);
        self.telemetry.command(HubCommand::SetPaused(paused))
    }
    fn reset_windows(&self) {
        self.telemetry.command(HubCommand::ResetWindows)
    }
    fn checkpoint(&self) -> Result<(), String> {
        if !self.can_save {
            return Err("no --save-dir: checkpoints have nowhere to go".into());
        }
        self.telemetry.command(HubCommand::Checkpoint);
        Ok(())
    }
    fn live(&self) -> bool {
        true
    }
    fn quit_stops_run(&self) -> bool {
        !self.attached
    }
    fn attached(&self) -> Option<String> {
        self.attached_label.clone()
    }
    fn names(&self) -> Arc<crate::telemetry::names::Names> {
        self.telemetry.names()
    }
}

/// A replay's controls: nothing reaches an engine; the badges show what the recording says.
#[derive(Default)]
pub struct ReplayControls;

impl Controls for ReplayControls {
    fn profiling(&self) -> bool {
        true
    }
    fn set_profiling(&self, _: bool) {}
    fn gpu_timing(&self) -> GpuTiming {
        GpuTiming::Async
    }
    fn set_gpu_timing(&self, _: GpuTiming) {}
    fn paused(&self) -> bool {
        false
    }
    fn set_paused(&self, _: bool) {}
    fn reset_windows(&self) {}
    fn checkpoint(&self) -> Result<(), String> {
        Err("replay: no engine to checkpoint".into())
    }
    fn live(&self) -> bool {
        false
    }
}

/// A recording played by a `Player`: space pauses it, `<` `>` and the arrows seek, `,` `.` set
/// its speed; nothing reaches an engine.
pub struct PlayerControls<'a> {
    pub player: &'a crate::wire::replay::Player,
}

impl Controls for PlayerControls<'_> {
    fn profiling(&self) -> bool {
        true
    }
    fn set_profiling(&self, _: bool) {}
    fn gpu_timing(&self) -> GpuTiming {
        GpuTiming::Async
    }
    fn set_gpu_timing(&self, _: GpuTiming) {}
    fn paused(&self) -> bool {
        self.player.pos().paused
    }
    fn set_paused(&self, paused: bool) {
        self.player.set_paused(paused)
    }
    fn reset_windows(&self) {}
    fn checkpoint(&self) -> Result<(), String> {
        Err("replay: no engine to checkpoint".into())
    }
    fn live(&self) -> bool {
        false
    }
    fn replay(&self) -> Option<crate::wire::replay::ReplayPos> {
        Some(self.player.pos())
    }
    fn seek(&self, delta_s: f64) -> Option<f64> {
        Some(self.player.seek_by(delta_s))
    }
    fn set_speed(&self, speed: crate::wire::replay::Speed) {
        self.player.set_speed(speed)
    }
    fn names(&self) -> Arc<crate::telemetry::names::Names> {
        self.player.names.clone()
    }
}

/// Reads terminal events on a named thread until `stop` is set.
pub fn spawn_input(
    stop: Arc<AtomicBool>,
) -> std::io::Result<(Receiver<Event>, std::thread::JoinHandle<()>)> {
    let (tx, rx) = unbounded();
    let h = std::thread::Builder::new()
        .name("ui-input".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if event::poll(Duration::from_millis(30)).unwrap_or(false) {
                    match event::read() {
                        Ok(e) => {
                            if tx.send(e).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        })?;
    Ok((rx, h))
}

/// The badges: the live engine's switches, or in a replay the modes the snapshot recorded.
pub fn badges(ctl: &dyn Controls, app: &App) -> Badges {
    match app.shown().filter(|_| !ctl.live()) {
        Some(s) => Badges {
            profiling: s.profiling,
            gpu_timing: s.gpu_timing.unwrap_or(GpuTiming::Async),
            paused: s.paused,
            live: false,
            replay: ctl.replay(),
        },
        None => Badges {
            profiling: ctl.profiling(),
            gpu_timing: ctl.gpu_timing(),
            paused: ctl.paused(),
            live: ctl.live(),
            replay: ctl.replay(),
        },
    }
}

/// Why the front-end stops following the engine: a line for the header, and whether the run
/// itself ended (then the screen shows it finished: frozen, with its summary) or only this
/// viewer's time did (an attach deadline).
#[derive(Clone, Debug, PartialEq)]
pub struct End {
    pub note: String,
    pub run_ended: bool,
}

impl End {
    /// The run ended (finished, failed, or the recording or stream ran out).
    pub fn run(note: impl Into<String>) -> Option<End> {
        Some(End {
            note: note.into(),
            run_ended: true,
        })
    }
}

/// The UI loop, generic over the backend so tests drive it with `TestBackend`. Returns when the
/// user quits, or a panic anywhere was caught by the hook. `finished` says once the engine
/// stopped by itself (the screen stays until the user quits).
pub fn run_loop<B: Backend>(
    term: &mut Terminal<B>,
    app: &mut App,
    ctl: &dyn Controls,
    snapshots: &Receiver<Arc<Snapshot>>,
    input: &Receiver<Event>,
    finished: &dyn Fn() -> Option<End>,
    theme: Theme,
) -> anyhow::Result<()>
where
    B::Error: Send + Sync + 'static,
{
    let ticker = tick(FRAME);
    // Once the feed ends (a finished replay), stop selecting on it: a disconnected channel is
    // always ready and would spin the loop.
    let mut feed = snapshots.clone();
    let mut dirty = true;
    let mut last_draw = Instant::now() - FRAME;
    // A signal (SIGINT/SIGTERM/SIGHUP) quits like `q`; the ticker wakes the loop to see it.
    while !app.quit && !terminal::PANICKED.load(Ordering::SeqCst) && !crate::signals::requested() {
        if dirty && last_draw.elapsed() >= FRAME / 4 {
            term.draw(|f| view::draw(f, app, theme, badges(ctl, app)))?;
            last_draw = Instant::now();
            dirty = false;
        }
        select! {
            recv(feed) -> s => match s {
                Ok(s) => app.on_snapshot(s),
                Err(_) => feed = never(),
            },
            recv(input) -> e => match e {
                Ok(Event::Key(k)) => {
                    let replay = ctl.replay().is_some();
                    if let Some(a) = app.keys.action(k).map(|a| keys::in_replay(k, a, replay)) {
                        app.update(a, ctl);
                        // Draw now: a key shows its effect within one frame.
                        term.draw(|f| view::draw(f, app, theme, badges(ctl, app)))?;
                        last_draw = Instant::now();
                    }
                }
                Ok(Event::Mouse(m)) => {
                    app.on_mouse(m, ctl);
                    term.draw(|f| view::draw(f, app, theme, badges(ctl, app)))?;
                    last_draw = Instant::now();
                }
                Ok(Event::Resize(_, _)) => {
                    term.autoresize()?;
                    dirty = true;
                }
                Ok(_) => {}
                Err(_) => app.quit = true,
            },
            recv(ticker) -> _ => {
                dirty = true;
                // Once: a replay seeking back from its end clears `finished`, and ends again.
                if !app.finished {
                    if let Some(end) = finished() {
                        app.note = Some(end.note);
                        app.finished = true;
                        if end.run_ended {
                            app.end_run();
                        }
                    }
                }
            },
        }
    }
    Ok(())
}
