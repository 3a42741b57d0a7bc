//! Which stage starves: a verdict from queue wait shares, with hysteresis so that it does not
//! flicker. A state is entered above `ENTER`, left below `EXIT`, and a change must hold for
//! `HOLD_TICKS` consecutive ticks before it is shown.

use serde::{Deserialize, Serialize};

pub const ENTER: f64 = 0.30;
pub const EXIT: f64 = 0.15;
pub const HOLD_TICKS: u32 = 3;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    #[default]
    Warmup,
    Balanced,
    /// Targets wait on an empty batch queue.
    LoaderBound,
    /// Drafters wait on an empty HS queue.
    TargetBound,
    /// Targets wait on a full HS queue.
    DrafterBound,
    /// Training is paused: time is neither work nor wait.
    Paused,
    /// No step has ended for several typical step times (the snapshot names what hangs).
    Stalled,
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Warmup => "warming up",
            Verdict::Balanced => "balanced",
            Verdict::LoaderBound => "targets starved: loader-bound",
            Verdict::TargetBound => "drafters starved: target-bound",
            Verdict::DrafterBound => "targets blocked on HS queue: drafter-bound",
            Verdict::Paused => "paused",
            Verdict::Stalled => "stalled",
        }
    }

    pub fn short(self) -> &'static str {
        match self {
            Verdict::Warmup => "warmup",
            Verdict::Balanced => "balanced",
            Verdict::LoaderBound => "loader-bound",
            Verdict::TargetBound => "target-bound",
            Verdict::DrafterBound => "drafter-bound",
            Verdict::Paused => "paused",
            Verdict::Stalled => "stalled",
        }
    }
}

/// Shares of time (0..1) each side spends waiting, over the last window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WaitShares {
    /// Targets waiting on an empty batch queue.
    pub targets_starved: f64,
    /// Drafters waiting on an empty HS queue.
    pub drafters_starved: f64,
    /// Targets waiting on a full HS queue.
    pub targets_blocked: f64,
}

#[derive(Clone, Debug, Default)]
pub struct VerdictTracker {
    shown: Verdict,
    candidate: Verdict,
    streak: u32,
}

impl VerdictTracker {
    pub fn shown(&self) -> Verdict {
        self.shown
    }

    fn above(&self, v: Verdict, share: f64) -> bool {
        share > if self.shown == v { EXIT } else { ENTER }
    }

    /// The raw verdict for this tick: the root cause first (a starved target starves drafters).
    fn classify(&self, s: WaitShares) -> Verdict {
        if self.above(Verdict::LoaderBound, s.targets_starved) {
            Verdict::LoaderBound
        } else if self.above(Verdict::TargetBound, s.drafters_starved) {
            Verdict::TargetBound
        } else if self.above(Verdict::DrafterBound, s.targets_blocked) {
            Verdict::DrafterBound
        } else {
            Verdict::Balanced
        }
    }

    /// Feeds one tick's shares; returns the verdict to show.
    pub fn update(&mut self, s: WaitShares) -> Verdict {
        let raw = self.classify(s);
        if raw == self.shown {
            self.streak = 0;
            self.candidate = raw;
            return self.shown;
        }
        if raw == self.candidate {
            self.streak += 1;
        } else {
            self.candidate = raw;
            self.streak = 1;
        }
        if self.streak >= HOLD_TICKS || self.shown == Verdict::Warmup {
            self.shown = raw;
            self.streak = 0;
        }
        self.shown
    }

    pub fn reset(&mut self) {
        *self = VerdictTracker::default();
    }
}
