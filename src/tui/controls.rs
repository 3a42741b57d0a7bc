//! What the front-end can ask of the engine it watches (a live run, an attached one, or none in
//! a replay).

use crate::telemetry::names::Names;
use crate::telemetry::GpuTiming;
use crate::wire::replay::{ReplayPos, Speed};
use std::sync::Arc;

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
    /// A replay that can be steered: where it is (None for a live engine).
    fn replay(&self) -> Option<ReplayPos> {
        None
    }
    /// Seeks a steerable replay by `delta_s`; returns where it goes.
    fn seek(&self, _delta_s: f64) -> Option<f64> {
        None
    }
    fn set_speed(&self, _speed: Speed) {}
    /// Watching other processes: `attached to PID 1234 (python) since 14:03:12`, or the ranks
    /// of a job on this host's screen.
    fn attached(&self) -> Option<String> {
        None
    }
    /// The names of the pipeline watched (ours unless it declares its own).
    fn names(&self) -> Arc<Names> {
        Arc::default()
    }
}
