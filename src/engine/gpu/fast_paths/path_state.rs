//! Whether a fast path ran in this process (graphs, the target's kernels): the state each path
//! keeps for `bench` and `doctor`, and that stops a failed path from being tried again.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Whether a fast path (graphs, kernels) ran in this process: untried, ran, or failed, with the
/// first failure's reason (for `bench` and `doctor`).
pub struct PathState {
    state: AtomicU8,
    reason: OnceLock<String>,
}

impl PathState {
    pub const fn untried() -> PathState {
        PathState {
            state: AtomicU8::new(0),
            reason: OnceLock::new(),
        }
    }

    pub fn ran(&self) {
        self.state.store(1, Ordering::Relaxed);
    }

    /// Notes one attempt's `outcome` (ran, or failed and left from now on); whether it ran.
    pub fn took(&self, outcome: anyhow::Result<()>) -> bool {
        match outcome {
            Ok(()) => {
                self.ran();
                true
            }
            Err(e) => {
                self.failed(&e);
                false
            }
        }
    }

    /// The path failed and is left from now on.
    pub fn failed(&self, why: &anyhow::Error) {
        let _ = self.reason.set(format!("{why:#}"));
        self.state.store(2, Ordering::Relaxed);
    }

    /// One attempt failed while others ran and keep running (a graph kept per shape).
    pub fn failed_once(&self, why: &anyhow::Error) {
        let _ = self.reason.set(format!("{why:#}"));
        let _ = self
            .state
            .compare_exchange(0, 2, Ordering::Relaxed, Ordering::Relaxed);
    }

    pub fn has_failed(&self) -> bool {
        self.state.load(Ordering::Relaxed) == 2
    }

    /// `on` once it ran (with the reason where an attempt failed), `off (failed: …)` after a
    /// failure, else `off`.
    pub fn describe(&self, on: &str, off: &str) -> String {
        let reason = self.reason.get();
        match (self.state.load(Ordering::Relaxed), reason) {
            (1, Some(why)) => format!("{on} (one attempt failed: {why})"),
            (1, None) => on.into(),
            (2, why) => format!("{off} (failed: {})", why.map_or("?", String::as_str)),
            _ => off.into(),
        }
    }
}
