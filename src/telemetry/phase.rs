//! Phases and roles, with the built-in pipeline's names. A declared stage's or phase's own name
//! comes from the `Names` of its pipeline (src/telemetry/names.rs), which snapshots carry.

use serde::{Deserialize, Serialize};

/// One stage of a worker's iteration. `Other` is the wall time no phase covers.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[repr(u8)]
pub enum Phase {
    #[default]
    Other = 0,
    Read,
    Pack,
    PushWait,
    BatchWait,
    H2d,
    Forward,
    HsPack,
    HsPushWait,
    HsWait,
    Anchors,
    Loss,
    Backward,
    Clip,
    Optim,
    Metrics,
    /// Drafter replicas averaging their gradients (data parallel).
    GradSync,
    /// Phases a client declared in its stage table (names from its `Names`), beyond the above.
    Custom0,
    Custom1,
    Custom2,
    Custom3,
    Custom4,
    Custom5,
    Custom6,
    Custom7,
    Custom8,
    Custom9,
    Custom10,
    Custom11,
}

/// The built-in phases (the DFlash pipeline's names), before the declared slots.
pub const N_BUILTIN: usize = 17;
/// Phase names a stage table may declare beyond the built-in ones.
pub const N_CUSTOM: usize = 12;
pub const N_PHASES: usize = N_BUILTIN + N_CUSTOM;

impl Phase {
    pub const ALL: [Phase; N_PHASES] = [
        Phase::Other,
        Phase::Read,
        Phase::Pack,
        Phase::PushWait,
        Phase::BatchWait,
        Phase::H2d,
        Phase::Forward,
        Phase::HsPack,
        Phase::HsPushWait,
        Phase::HsWait,
        Phase::Anchors,
        Phase::Loss,
        Phase::Backward,
        Phase::Clip,
        Phase::Optim,
        Phase::Metrics,
        Phase::GradSync,
        Phase::Custom0,
        Phase::Custom1,
        Phase::Custom2,
        Phase::Custom3,
        Phase::Custom4,
        Phase::Custom5,
        Phase::Custom6,
        Phase::Custom7,
        Phase::Custom8,
        Phase::Custom9,
        Phase::Custom10,
        Phase::Custom11,
    ];

    /// A built-in phase's name; a custom slot's neutral `phaseN` (its declared name is in the
    /// pipeline's `Names`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Read => "read",
            Phase::Pack => "pack",
            Phase::PushWait => "push_wait",
            Phase::BatchWait => "batch_wait",
            Phase::H2d => "h2d",
            Phase::Forward => "forward",
            Phase::HsPack => "hs_pack",
            Phase::HsPushWait => "hs_push_wait",
            Phase::HsWait => "hs_wait",
            Phase::Anchors => "anchors",
            Phase::Loss => "loss",
            Phase::Backward => "backward",
            Phase::Clip => "clip",
            Phase::Optim => "optim",
            Phase::Metrics => "metrics",
            Phase::GradSync => "grad_sync",
            custom => fallback_phase(custom.index() - N_BUILTIN),
        }
    }

    /// A declared slot's number (0..N_CUSTOM), None for a built-in phase.
    pub fn custom_slot(self) -> Option<usize> {
        self.index().checked_sub(N_BUILTIN)
    }

    /// The built-in phase of this name, if any.
    pub fn builtin(name: &str) -> Option<Phase> {
        Phase::ALL[..N_BUILTIN]
            .iter()
            .copied()
            .find(|p| p.name() == name)
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: usize) -> Option<Phase> {
        Phase::ALL.get(i).copied()
    }

    /// Built-in phases spent blocked on a queue rather than working (whether a declared phase
    /// is a wait depends on its name: `Names::is_wait`).
    pub fn is_wait(self) -> bool {
        matches!(
            self,
            Phase::PushWait | Phase::BatchWait | Phase::HsPushWait | Phase::HsWait
        )
    }
}

/// What a thread does in the pipeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    Loader,
    Target,
    Drafter,
    /// The hub's own measurements (never shown as a worker).
    Hub,
    /// Stage `k` of a chain a client declared (its name and phases in its pipeline's `Names`).
    Stage(u8),
}

impl Role {
    /// A built-in role's name; a declared stage's neutral `stageN` (its declared name is in the
    /// pipeline's `Names`).
    pub fn name(self) -> &'static str {
        match self {
            Role::Loader => "loader",
            Role::Target => "target",
            Role::Drafter => "drafter",
            Role::Hub => "hub",
            Role::Stage(k) => fallback_stage(k as usize),
        }
    }

    /// Where the role sits in the pipeline, upstream first (the order threads are listed in).
    pub fn rank(self) -> u8 {
        match self {
            Role::Loader => 0,
            Role::Target => 1,
            Role::Drafter => 2,
            Role::Stage(k) => k,
            Role::Hub => u8::MAX,
        }
    }

    /// Whether this built-in role's steps carry the pipeline's tokens (drafters; a declared
    /// stage's answer is in its `Names`).
    pub fn counts_tokens(self) -> bool {
        self == Role::Drafter
    }

    /// The phases this built-in role marks, in pipeline order, `other` last (a declared stage's
    /// are in its `Names`).
    pub fn phases(self) -> &'static [Phase] {
        use Phase::*;
        match self {
            Role::Loader => &[Read, Pack, PushWait, Other],
            Role::Target => &[BatchWait, H2d, Forward, HsPack, HsPushWait, Other],
            Role::Drafter => &[
                HsWait, Anchors, Forward, Loss, Backward, GradSync, Clip, Optim, Metrics, Other,
            ],
            Role::Hub | Role::Stage(_) => &[Other],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_round_trip_and_names_are_unique() {
        for (i, p) in Phase::ALL.iter().enumerate() {
            assert_eq!(p.index(), i);
            assert_eq!(Phase::from_index(i), Some(*p));
        }
        let mut names: Vec<_> = Phase::ALL[..N_BUILTIN].iter().map(|p| p.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), N_BUILTIN);
    }
}

/// Stages a table may declare (the verdict and the thread order index them with a byte).
pub const MAX_STAGES: usize = 16;

/// A custom slot's name when no names are at hand: `phase3`.
pub fn fallback_phase(slot: usize) -> &'static str {
    const FALLBACK: [&str; N_CUSTOM] = [
        "phase0", "phase1", "phase2", "phase3", "phase4", "phase5", "phase6", "phase7", "phase8",
        "phase9", "phase10", "phase11",
    ];
    FALLBACK[slot.min(N_CUSTOM - 1)]
}

/// A declared stage's name when no names are at hand: `stage2`.
pub fn fallback_stage(k: usize) -> &'static str {
    const FALLBACK: [&str; MAX_STAGES] = [
        "stage0", "stage1", "stage2", "stage3", "stage4", "stage5", "stage6", "stage7", "stage8",
        "stage9", "stage10", "stage11", "stage12", "stage13", "stage14", "stage15",
    ];
    FALLBACK.get(k).copied().unwrap_or("stage")
}

/// The phase of a custom slot.
pub fn custom_phase(slot: usize) -> Phase {
    Phase::ALL[N_BUILTIN + slot.min(N_CUSTOM - 1)]
}

thread_local! {
    /// The phase this thread last marked, whatever the profiling switch: what an error report
    /// and a host sync name. A thread-local cell, so marking stays lock- and alloc-free.
    static CURRENT: std::cell::Cell<Option<Phase>> = const { std::cell::Cell::new(None) };
}

/// The phase the calling thread last marked (None before its first mark).
pub fn current() -> Option<Phase> {
    CURRENT.with(|c| c.get())
}

/// The calling thread enters `phase` (a worker's marks call it).
#[inline]
pub fn set_current(phase: Phase) {
    CURRENT.with(|c| c.set(Some(phase)));
}
