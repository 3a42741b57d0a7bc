//! One file per panel; each renders from the snapshot only, through `Ctx`.

pub mod charts;
pub mod gpus;
pub mod header;
pub mod help;
pub mod phases;
pub mod queues;
pub mod shares;
pub mod stacked;
pub mod summary;
pub mod thread_detail;
pub mod threads;
pub mod timeline;
pub mod warnings;

use super::app::App;
use super::choices::Window;
use super::theme::Theme;
use crate::telemetry::snapshot::{PhaseWindow, ThreadView};
use crate::telemetry::{GpuTiming, Snapshot};

/// The engine switches as the front-end last set or read them (shown at once, not a tick later).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Badges {
    pub profiling: bool,
    pub gpu_timing: GpuTiming,
    pub paused: bool,
    pub live: bool,
    /// A replay's position bar (None: live, or a replay nobody steers).
    pub replay: Option<crate::wire::replay::ReplayPos>,
}

/// What every panel renders from.
pub struct Ctx<'a> {
    pub snap: &'a Snapshot,
    pub app: &'a App,
    pub theme: Theme,
    pub badges: Badges,
}

impl Ctx<'_> {
    pub fn window_of(&self, t: &ThreadView) -> PhaseWindow {
        match self.app.window {
            Window::OneSecond => t.w1,
            Window::TenSeconds => t.w10,
            Window::Run => t.run,
        }
    }

    /// The thread a stall names (`drafter-0 in other for 6.0 s`), while the verdict is
    /// `stalled`: its label is drawn as the fault it is, wherever it shows.
    pub fn stalled_thread(&self) -> Option<&str> {
        if self.snap.verdict != crate::telemetry::verdict::Verdict::Stalled {
            return None;
        }
        let first = self.snap.stall.as_deref()?.split_whitespace().next()?;
        self.snap
            .threads
            .iter()
            .find(|t| t.name == first)
            .map(|t| t.name.as_str())
    }

    /// The style of a thread's name: red while it is the one a stall names, else `base`.
    pub fn name_style(&self, name: &str, base: ratatui::style::Style) -> ratatui::style::Style {
        if self.stalled_thread() == Some(name) {
            base.patch(self.theme.alert())
        } else {
            base
        }
    }

    /// `profiling off since 00:01:12` (the run's clock, as the header's elapsed time) when the
    /// shown snapshot says profiling is off: phase times stop, steps and CPU go on.
    pub fn profiling_off(&self) -> Option<String> {
        if self.app.shown().is_none() || self.snap.profiling {
            return None;
        }
        let since = self.app.profiling_off_since.unwrap_or(self.snap.elapsed_s);
        Some(format!(
            "profiling off since {}",
            header::fmt_elapsed(since)
        ))
    }
}
