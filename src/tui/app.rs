//! Front-end state, what the snapshots feed into it, and what the panels ask of it; the one
//! `update` that changes it by an `Action` is in app/update.rs (keys.rs says which key is which
//! action). No terminal here: tests drive it directly.

use super::history::History;
use super::keys::Action;
use super::lanes::TimeSpan;
use super::segments::Segments;
use crate::summary::{RunInfo, Summary};
use crate::telemetry::snapshot::{StepSpan, ThreadState, ThreadView};
use crate::telemetry::Snapshot;
use std::collections::VecDeque;
use std::sync::Arc;

use super::choices::{Sort, View, Window, ZOOMS_S};
use super::controls::Controls;

mod update;

/// The display as it was when it froze: the snapshot and the history behind it (the timeline
/// pans over it; the CPU history and the verdict marks stand still with it).
#[derive(Clone)]
pub struct Frozen {
    pub snap: Arc<Snapshot>,
    history: History,
}

pub struct App {
    pub view: View,
    pub window: Window,
    pub help: bool,
    /// Rows the help overlay is scrolled down by (j/k while it is open).
    pub help_scroll: u16,
    /// How far the help could scroll in the last frame (set as it is drawn).
    pub help_max: std::cell::Cell<u16>,
    pub quit: bool,
    /// What is on screen while frozen.
    pub frozen: Option<Frozen>,
    pub latest: Option<Arc<Snapshot>>,
    /// A short note about the last key (shown in the header).
    pub note: Option<String>,
    /// What the snapshots so far left (`shown_history`: what is on screen).
    pub history: History,
    /// The timeline's width, an index into `ZOOMS_S`.
    pub zoom: usize,
    /// How far the timeline's right edge is before the frozen snapshot's time, ns.
    pub pan_ns: u64,
    /// The selected thread, by name (stable while the order changes).
    pub selected: Option<String>,
    pub sort: Sort,
    /// Rows of the last frame that show a thread (y, name): where a click selects it.
    pub hits: std::cell::RefCell<Vec<(u16, String)>>,
    /// Keys bound in the UI config, checked before the defaults.
    pub keys: super::keys::KeyMap,
    /// Snapshots the hub published that this front-end never got (gaps in `seq`).
    pub missed_snapshots: u64,
    /// `q` was pressed once on a live run: the next `q` stops training.
    pub quit_armed: bool,
    /// The engine stopped by itself (run finished or failed): `q` leaves at once.
    pub finished: bool,
    /// Where the run's files go (for its summary).
    pub run_info: RunInfo,
    /// The run ended: its summary (the panel), and the screen stays at its last snapshot.
    pub summary: Option<Summary>,
    /// Since when (the run's clock, s) the snapshots say profiling is off; None while it is on.
    pub profiling_off_since: Option<f64>,
    /// The snapshots come from a replay: a jump in time is a seek, not snapshots missed.
    pub replay: bool,
    /// Watching other processes: the header's fourth row says which, since when.
    pub attached: Option<String>,
    /// Whether `q` stops what is watched (a job's screen) rather than only leaving it.
    pub quit_stops_run: bool,
    /// (run clock s, step) of the last `RATE_WINDOW_S` of snapshots: the step rate an ETA
    /// is reckoned from.
    pub step_marks: VecDeque<(f64, u64)>,
}

/// Seconds of snapshots the step rate (and so the ETA) is measured over.
pub const RATE_WINDOW_S: f64 = 10.0;

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
            help_scroll: 0,
            help_max: std::cell::Cell::new(u16::MAX),
            quit: false,
            frozen: None,
            latest: None,
            note: None,
            history: History::default(),
            zoom: ZOOMS_S.len() - 1,
            pan_ns: 0,
            selected: None,
            sort: Sort::Pipeline,
            keys: Default::default(),
            hits: Default::default(),
            missed_snapshots: 0,
            quit_armed: false,
            finished: false,
            run_info: RunInfo::default(),
            summary: None,
            profiling_off_since: None,
            replay: false,
            attached: None,
            quit_stops_run: false,
            step_marks: VecDeque::new(),
        }
    }

    /// The run ended: the screen stays at its last snapshot, every thread `exited`, no stall
    /// (nothing hangs: the run is over), and the summary panel shows what it came to.
    pub fn end_run(&mut self) {
        let Some(last) = &self.latest else {
            return;
        };
        let mut end = Snapshot::clone(last);
        end.stall = None;
        for t in &mut end.threads {
            t.state = ThreadState::Exited;
        }
        self.summary = Some(Summary::of(&end, &self.run_info));
        self.latest = Some(Arc::new(end));
    }

    /// The snapshot to render.
    pub fn shown(&self) -> Option<&Arc<Snapshot>> {
        self.frozen
            .as_ref()
            .map(|f| &f.snap)
            .or(self.latest.as_ref())
    }

    /// The wheel moves the selection; a click on a thread's row (table or lane) selects it.
    pub fn on_mouse(&mut self, m: crossterm::event::MouseEvent, ctl: &dyn Controls) {
        use crossterm::event::{MouseButton, MouseEventKind};
        match m.kind {
            MouseEventKind::ScrollDown => self.update(Action::SelectNext, ctl),
            MouseEventKind::ScrollUp => self.update(Action::SelectPrev, ctl),
            MouseEventKind::Down(MouseButton::Left) => {
                let hit = self
                    .hits
                    .borrow()
                    .iter()
                    .find(|(y, _)| *y == m.row)
                    .map(|h| h.1.clone());
                if hit.is_some() {
                    self.selected = hit;
                }
            }
            _ => {}
        }
    }

    /// The history behind the shown snapshot (frozen with it).
    pub fn shown_history(&self) -> &History {
        self.frozen.as_ref().map_or(&self.history, |f| &f.history)
    }

    /// The step spans behind the shown snapshot.
    pub fn shown_spans(&self) -> &VecDeque<StepSpan> {
        &self.shown_history().spans
    }

    /// The span the timeline shows: its width, ending at the shown snapshot's time less the pan.
    /// A recording without the hub's clock ends at its last step.
    pub fn time_span(&self) -> TimeSpan {
        let now = self.shown().map(|s| s.now_ns).unwrap_or(0);
        let right = if now > 0 {
            now
        } else {
            self.shown_spans()
                .iter()
                .map(|s| s.end_ns)
                .max()
                .unwrap_or(0)
        };
        TimeSpan {
            right_ns: right.saturating_sub(self.pan_ns),
            width_ns: (ZOOMS_S[self.zoom] * 1e9) as u64,
        }
    }

    /// The phase segments behind the shown snapshot.
    pub fn shown_segments(&self) -> &Segments {
        &self.shown_history().segments
    }

    /// The shown snapshot's threads in the chosen order.
    pub fn ordered_threads<'a>(&self, snap: &'a Snapshot) -> Vec<&'a ThreadView> {
        let mut v: Vec<&ThreadView> = snap.threads.iter().collect();
        let w = |t: &ThreadView| t.w1.step_ms();
        match self.sort {
            Sort::Pipeline => {}
            Sort::Cpu => v.sort_by(|a, b| {
                b.cpu_pct
                    .unwrap_or(-1.0)
                    .total_cmp(&a.cpu_pct.unwrap_or(-1.0))
            }),
            // Profiling off marks no phase: the kernel's state says who waits (asleep, I/O).
            Sort::State if !snap.profiling => v.sort_by_key(|t| match (t.state, t.os_state) {
                (ThreadState::Exited, _) => 2,
                (_, Some('S' | 'D')) => 0,
                _ => 1,
            }),
            Sort::State => v.sort_by_key(|t| match t.state {
                ThreadState::Waiting => 0,
                ThreadState::Working => 1,
                ThreadState::Exited => 2,
            }),
            Sort::MsPerStep => v.sort_by(|a, b| w(b).total_cmp(&w(a))),
            Sort::Name => v.sort_by(|a, b| a.name.cmp(&b.name)),
        }
        v
    }

    /// The thread the detail panes show: the selected one, else the first in order.
    pub fn focus<'a>(&self, snap: &'a Snapshot) -> Option<&'a ThreadView> {
        let order = self.ordered_threads(snap);
        let i = self.selected_index(&order).unwrap_or(0);
        order.get(i).copied()
    }

    /// The selected thread's position in the chosen order.
    pub fn selected_index(&self, order: &[&ThreadView]) -> Option<usize> {
        let name = self.selected.as_ref()?;
        order.iter().position(|t| &t.name == name)
    }

    pub fn on_snapshot(&mut self, s: Arc<Snapshot>) {
        if self.summary.is_some() {
            // Ended: the bars stay at the run's last window; only a later step (one the hub
            // published after the threads were seen to exit) moves the end forward.
            let last = self.latest.as_ref().map_or(0, |l| l.train.step);
            if s.train.step <= last {
                return;
            }
            self.history.record(&s);
            self.latest = Some(s);
            self.end_run();
            return;
        }
        // A new line from the engine (a saved checkpoint, …) replaces the last key's note.
        let previous = self.latest.as_ref().and_then(|l| l.status.as_ref());
        if s.status.is_some() && s.status.as_ref() != previous {
            self.note = None;
        }
        if let Some(prev) = &self.latest {
            if !self.replay {
                self.missed_snapshots += s.seq.saturating_sub(prev.seq + 1);
            } else if s.now_ns < prev.now_ns {
                // A replay sought back: what was kept is from later on.
                self.history = History::default();
                self.profiling_off_since = None;
            }
        }
        self.profiling_off_since = match (s.profiling, self.profiling_off_since) {
            (true, _) => None,
            (false, since) => Some(since.unwrap_or(s.elapsed_s)),
        };
        self.history.record(&s);
        self.mark_step(&s);
        self.latest = Some(s);
    }

    fn mark_step(&mut self, s: &Snapshot) {
        // A replay sought back, or windows reset: start the rate over.
        if self
            .step_marks
            .back()
            .is_some_and(|(t, n)| s.elapsed_s < *t || s.train.step < *n)
        {
            self.step_marks.clear();
        }
        self.step_marks.push_back((s.elapsed_s, s.train.step));
        while self
            .step_marks
            .front()
            .is_some_and(|(t, _)| s.elapsed_s - t > RATE_WINDOW_S)
        {
            self.step_marks.pop_front();
        }
    }

    /// `(step, of, seconds left)` when the run stops at `--steps`: the ETA at the rate of the
    /// last `RATE_WINDOW_S` (None until two snapshots a second apart have steps between them).
    pub fn progress(&self) -> Option<(u64, u64, Option<f64>)> {
        let of = self.run_info.steps?;
        let step = self.shown()?.train.step;
        let (t0, n0) = *self.step_marks.front()?;
        let (t1, n1) = *self.step_marks.back()?;
        let rate = (t1 - t0 >= 1.0 && n1 > n0).then(|| (n1 - n0) as f64 / (t1 - t0));
        Some((step, of, rate.map(|r| of.saturating_sub(step) as f64 / r)))
    }
}

/// `1:12`, `1:02:03`: a replay's position.
pub fn fmt_clock(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_step(step: u64, elapsed_s: f64) -> Arc<Snapshot> {
        let mut s = Snapshot::default();
        s.train.step = step;
        s.elapsed_s = elapsed_s;
        s.stall = Some("drafter-0 in other for 6.0 s".into());
        Arc::new(s)
    }

    #[test]
    fn an_ended_run_keeps_its_last_window_but_takes_a_later_step() {
        let mut app = App::new();
        app.on_snapshot(at_step(299, 10.0));
        app.end_run();
        assert_eq!(app.summary.as_ref().map(|s| s.step), Some(299));
        assert!(app.latest.as_ref().unwrap().stall.is_none(), "no stall");
        // The hub goes on: no new step, nothing moves.
        app.on_snapshot(at_step(299, 30.0));
        assert_eq!(app.latest.as_ref().unwrap().elapsed_s, 10.0);
        // The last step arrived after the threads were seen to exit: the end moves to it.
        app.on_snapshot(at_step(300, 10.1));
        let s = app.summary.as_ref().unwrap();
        assert_eq!((s.step, s.elapsed_s), (300, 10.1));
        assert!(app.latest.as_ref().unwrap().stall.is_none());
    }
}
