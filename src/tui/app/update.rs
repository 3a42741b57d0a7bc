//! `App::update`: what each `Action` does to the front-end's state, and through `Controls` to
//! the engine it watches. One small function per action that needs more than a line.

use super::{fmt_clock, Action, App, Controls, Frozen, View, Window, ZOOMS_S};
use crate::tui::lanes::spans_in;
use crate::wire::replay::SEEK_STEP_S;

impl App {
    /// The keys that quit, as the question names them: those a UI config binds to quit, then
    /// `q` unless the config gave `q` to another action.
    fn quit_keys(&self) -> String {
        let mut keys: Vec<&str> = self
            .keys
            .described
            .iter()
            .filter(|(_, action)| action == "quit")
            .map(|(key, _)| key.as_str())
            .collect();
        let q_taken = self.keys.bound.iter().any(|(code, ctrl, action)| {
            *code == crossterm::event::KeyCode::Char('q') && !*ctrl && *action != Action::Quit
        });
        if !q_taken && !keys.contains(&"q") {
            keys.push("q");
        }
        keys.join(" or ")
    }

    pub fn update(&mut self, action: Action, ctl: &dyn Controls) {
        let armed = std::mem::take(&mut self.quit_armed);
        match action {
            Action::Quit if armed || !ctl.quit_stops_run() || self.finished => self.quit = true,
            Action::Quit => {
                self.quit_armed = true;
                self.note = Some(format!(
                    "{} again to stop training (the run saves as configured)",
                    self.quit_keys()
                ));
            }
            Action::QuitNow => self.quit = true,
            Action::Back => self.back(),
            Action::ToggleProfiling => self.toggle_profiling(ctl),
            // No GPU worker: the modes mean nothing (the badge and the help leave `g` out).
            Action::CycleGpuTiming if self.shown().is_some_and(|s| s.gpu_timing.is_none()) => {
                self.note = Some("no GPU worker here: GPU timing modes do not apply".into());
            }
            Action::CycleGpuTiming => self.cycle_gpu_timing(ctl),
            Action::TogglePause if ctl.replay().is_some() => self.toggle_replay_pause(ctl),
            Action::SeekBack => self.seek(-SEEK_STEP_S, ctl),
            Action::SeekForward => self.seek(SEEK_STEP_S, ctl),
            Action::Slower | Action::Faster => self.change_speed(action == Action::Faster, ctl),
            Action::TogglePause => self.toggle_training_pause(ctl),
            Action::ToggleFreeze => self.toggle_freeze(),
            Action::ResetWindows => self.reset_windows(ctl),
            Action::Checkpoint => self.checkpoint(ctl),
            Action::NextView => self.view = View::ALL[(self.view.index() + 1) % View::ALL.len()],
            Action::PrevView => {
                self.view = View::ALL[(self.view.index() + View::ALL.len() - 1) % View::ALL.len()]
            }
            Action::ShowView(i) => {
                if let Some(v) = View::ALL.get(i) {
                    self.view = *v;
                }
            }
            Action::ToggleHelp => {
                self.help = !self.help;
                self.help_scroll = 0;
            }
            // With the help open, j/k scroll it (the overlay clamps to its length).
            Action::SelectNext if self.help => {
                self.help_scroll = (self.help_scroll + 1).min(self.help_max.get())
            }
            Action::SelectPrev if self.help => {
                self.help_scroll = self.help_scroll.saturating_sub(1)
            }
            Action::ExportTrace => self.export_trace(),
            Action::SelectNext => self.select_step(true),
            Action::SelectPrev => self.select_step(false),
            Action::CycleSort => {
                self.sort = self.sort.next();
                self.note = Some(format!("threads sorted by {}", self.sort.name()));
            }
            Action::ZoomIn | Action::ZoomOut => self.zoom(action == Action::ZoomIn),
            Action::PanBack | Action::PanForward => self.pan(action == Action::PanBack),
            Action::CycleWindow => self.cycle_window(),
        }
    }

    /// Whether the engine can be changed from here; a note saying why not in a replay.
    fn engine_only(&mut self, ctl: &dyn Controls) -> bool {
        if !ctl.live() {
            self.note = Some("replay: the engine cannot be changed".into());
            return false;
        }
        true
    }

    /// Esc: closes the help, else clears the selection.
    fn back(&mut self) {
        if self.help {
            self.help = false;
        } else if self.selected.is_some() {
            self.selected = None;
        } else {
            self.note = Some("nothing to close (q quits)".into());
        }
    }

    fn toggle_profiling(&mut self, ctl: &dyn Controls) {
        if self.engine_only(ctl) {
            let on = !ctl.profiling();
            ctl.set_profiling(on);
            self.note = Some(format!("profiling {}", if on { "on" } else { "off" }));
        }
    }

    fn cycle_gpu_timing(&mut self, ctl: &dyn Controls) {
        if self.engine_only(ctl) {
            let mode = ctl.gpu_timing().next();
            ctl.set_gpu_timing(mode);
            self.note = Some(format!("GPU timing: {}", mode.name()));
        }
    }

    fn toggle_replay_pause(&mut self, ctl: &dyn Controls) {
        let p = !ctl.paused();
        ctl.set_paused(p);
        self.note = Some(if p { "replay paused" } else { "replay playing" }.into());
    }

    fn toggle_training_pause(&mut self, ctl: &dyn Controls) {
        if self.engine_only(ctl) {
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

    /// A replay moves `delta_s` seconds; a live run has no later.
    fn seek(&mut self, delta_s: f64, ctl: &dyn Controls) {
        match ctl.seek(delta_s) {
            Some(to) => {
                // A seek leaves the end (if it was there): the run is not over on screen.
                self.summary = None;
                self.finished = false;
                self.frozen = None;
                self.pan_ns = 0;
                self.note = Some(format!("seeking to t={}", fmt_clock(to)));
            }
            None => self.note = Some("seeking is for replays: a live run has no later".into()),
        }
    }

    fn change_speed(&mut self, faster: bool, ctl: &dyn Controls) {
        match ctl.replay() {
            Some(pos) => {
                let speed = pos.speed.step(faster);
                ctl.set_speed(speed);
                self.note = Some(format!("replay speed {}", speed.name()));
            }
            None => self.note = Some("speed is for replays: a live run goes at its own".into()),
        }
    }

    fn toggle_freeze(&mut self) {
        if self.frozen.take().is_some() {
            self.pan_ns = 0;
        } else {
            self.freeze();
        }
        self.note = Some(
            if self.frozen.is_some() {
                "display frozen"
            } else {
                "display live"
            }
            .into(),
        );
    }

    fn freeze(&mut self) {
        if self.frozen.is_none() {
            self.frozen = self.latest.clone().map(|snap| Frozen {
                snap,
                history: self.history.clone(),
            });
        }
    }

    fn reset_windows(&mut self, ctl: &dyn Controls) {
        if ctl.live() {
            ctl.reset_windows();
            self.note = Some(
                "reset: the 1s and 10s windows, the run window's phase times, the verdict \
                 (the run's steps and tokens kept)"
                    .into(),
            );
        } else {
            self.note = Some("replay: the windows are the recording's; r resets none".into());
        }
    }

    fn checkpoint(&mut self, ctl: &dyn Controls) {
        if self.engine_only(ctl) {
            self.note = Some(match ctl.checkpoint() {
                Ok(()) => "checkpoint requested".into(),
                Err(why) => why,
            });
        }
    }

    /// Writes what the timeline shows (its width, where it is panned to) as a trace file.
    fn export_trace(&mut self) {
        let span = self.time_span();
        let spans = spans_in(self.shown_spans().iter(), span);
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let path = std::path::PathBuf::from(format!("dflash-top-trace-{stamp}.json"));
        self.note = Some(if spans.is_empty() {
            "no steps to trace yet".to_string()
        } else {
            let names = self.shown().map(|s| s.names.clone()).unwrap_or_default();
            match crate::telemetry::trace::write_trace(&path, &spans, &names) {
                Ok(()) if self.pan_ns == 0 => format!(
                    "trace of the last {} s: {}",
                    ZOOMS_S[self.zoom],
                    path.display()
                ),
                Ok(()) => format!(
                    "trace of {} s ending {:.1} s ago: {}",
                    ZOOMS_S[self.zoom],
                    self.pan_ns as f64 / 1e9,
                    path.display()
                ),
                Err(e) => format!("{e:#}"),
            }
        });
    }

    fn select_step(&mut self, down: bool) {
        let Some(snap) = self.shown().cloned() else {
            return;
        };
        let order = self.ordered_threads(&snap);
        if order.is_empty() {
            return;
        }
        let i = match (self.selected_index(&order), down) {
            (None, true) => 0,
            (None, false) => order.len() - 1,
            (Some(i), true) => (i + 1).min(order.len() - 1),
            (Some(i), false) => i.saturating_sub(1),
        };
        self.selected = Some(order[i].name.clone());
    }

    fn zoom(&mut self, zoom_in: bool) {
        self.zoom = if zoom_in {
            self.zoom.saturating_sub(1)
        } else {
            (self.zoom + 1).min(ZOOMS_S.len() - 1)
        };
        self.pan_ns = self.pan_ns.min(self.max_pan_ns());
        self.note = Some(format!("timeline: {} s", ZOOMS_S[self.zoom]));
    }

    /// Moves the timeline a quarter of its width back (or forward), frozen.
    fn pan(&mut self, back: bool) {
        self.freeze();
        let step = self.time_span().width_ns / 4;
        let was = self.pan_ns;
        self.pan_ns = if back {
            (self.pan_ns + step).min(self.max_pan_ns())
        } else {
            self.pan_ns.saturating_sub(step)
        };
        self.note = Some(match (back, self.pan_ns == was) {
            (true, true) => format!(
                "timeline: no earlier history (the last {} s of steps are kept)",
                crate::tui::history::TRACE_SECONDS
            ),
            (_, true) => "timeline: already at the frozen time (f: live)".to_string(),
            _ => format!(
                "timeline ends {:.2} s before the frozen time (f: live)",
                self.pan_ns as f64 / 1e9
            ),
        });
    }

    /// How far back the timeline can pan: to the oldest span kept.
    fn max_pan_ns(&self) -> u64 {
        let span = self.time_span();
        let right = span.right_ns + self.pan_ns;
        let oldest = self.shown_segments().oldest_ns().unwrap_or(right);
        right.saturating_sub(oldest).saturating_sub(span.width_ns)
    }

    fn cycle_window(&mut self) {
        self.window = match self.window {
            Window::OneSecond => Window::TenSeconds,
            Window::TenSeconds => Window::Run,
            Window::Run => Window::OneSecond,
        };
        self.note = Some(format!("phase window: {}", self.window.name()));
    }
}
