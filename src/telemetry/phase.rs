//! Phases and roles: the names the TUI shows (DESIGN.md §4).

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
}

pub const N_PHASES: usize = 17;

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
    ];

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
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn from_index(i: usize) -> Option<Phase> {
        Phase::ALL.get(i).copied()
    }

    /// Phases spent blocked on a queue rather than working.
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
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Loader => "loader",
            Role::Target => "target",
            Role::Drafter => "drafter",
            Role::Hub => "hub",
        }
    }

    /// The phases this role marks, in pipeline order, `other` last.
    pub fn phases(self) -> &'static [Phase] {
        use Phase::*;
        match self {
            Role::Loader => &[Read, Pack, PushWait, Other],
            Role::Target => &[BatchWait, H2d, Forward, HsPack, HsPushWait, Other],
            Role::Drafter => &[
                HsWait, Anchors, Forward, Loss, Backward, GradSync, Clip, Optim, Metrics, Other,
            ],
            Role::Hub => &[Other],
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
        let mut names: Vec<_> = Phase::ALL.iter().map(|p| p.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), N_PHASES);
    }
}
