//! Which stage starves: a verdict from queue wait shares, with hysteresis so that it does not
//! flicker. A state is entered above `ENTER`, left below `EXIT`, and a change must hold for
//! `HOLD_TICKS` consecutive ticks before it is shown.

use super::phase::Role;
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
    /// Declared stage `k` waits on its empty input queue: stage k-1 is the bottleneck.
    Starved(u8),
    /// Declared stage k-1 waits on a full queue into stage `k`: stage k is the bottleneck.
    Blocked(u8),
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
            Verdict::Starved(k) => super::stages::verdict_text(k as usize, true).0,
            Verdict::Blocked(k) => super::stages::verdict_text(k as usize, false).0,
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
            Verdict::Starved(k) => super::stages::verdict_text(k as usize, true).1,
            Verdict::Blocked(k) => super::stages::verdict_text(k as usize, false).1,
        }
    }

    /// The verdict when `consumer` waits on its empty input queue.
    fn starved(consumer: Role) -> Option<Verdict> {
        match consumer {
            Role::Target => Some(Verdict::LoaderBound),
            Role::Drafter => Some(Verdict::TargetBound),
            Role::Stage(k) => Some(Verdict::Starved(k)),
            _ => None,
        }
    }

    /// The verdict when the producers of `consumer`'s input queue wait on it being full.
    fn blocked(consumer: Role) -> Option<Verdict> {
        match consumer {
            Role::Drafter => Some(Verdict::DrafterBound),
            Role::Stage(k) => Some(Verdict::Blocked(k)),
            _ => None,
        }
    }
}

/// Shares of time (0..1) each side of one queue spends waiting, over the last window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QueueWait {
    /// The stage that pops from the queue.
    pub consumer: Role,
    /// Consumers waiting on the queue empty.
    pub starved: f64,
    /// Producers waiting on the queue full.
    pub blocked: f64,
}

/// The queues of a chain of stages, upstream first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WaitShares {
    pub chain: Vec<QueueWait>,
}

impl WaitShares {
    /// Our pipeline's two queues: targets starved on the batch queue, drafters starved on the HS
    /// queue, targets blocked on it.
    pub fn dflash(targets_starved: f64, drafters_starved: f64, targets_blocked: f64) -> Self {
        WaitShares {
            chain: vec![
                QueueWait {
                    consumer: Role::Target,
                    starved: targets_starved,
                    blocked: 0.0,
                },
                QueueWait {
                    consumer: Role::Drafter,
                    starved: drafters_starved,
                    blocked: targets_blocked,
                },
            ],
        }
    }
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

    /// The raw verdict for this tick, for any chain: the root cause first, upstream first (a
    /// starved target starves drafters); then producers blocked on the last queue (upstream
    /// queues full is prefetching doing its job, not a bottleneck).
    fn classify(&self, s: &WaitShares) -> Verdict {
        for q in &s.chain {
            if let Some(v) = Verdict::starved(q.consumer).filter(|v| self.above(*v, q.starved)) {
                return v;
            }
        }
        s.chain
            .last()
            .and_then(|q| Verdict::blocked(q.consumer).filter(|v| self.above(*v, q.blocked)))
            .unwrap_or(Verdict::Balanced)
    }

    /// Feeds one tick's shares; returns the verdict to show.
    pub fn update(&mut self, s: &WaitShares) -> Verdict {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(q: &[(f64, f64)]) -> WaitShares {
        WaitShares {
            chain: q
                .iter()
                .enumerate()
                .map(|(i, &(starved, blocked))| QueueWait {
                    consumer: Role::Stage(i as u8 + 1),
                    starved,
                    blocked,
                })
                .collect(),
        }
    }

    #[test]
    fn any_chain_of_declared_stages_gets_the_root_cause() {
        // read -> decode -> train: the first starved stage names its producer, upstream first.
        let cases = [
            (chain(&[(0.0, 0.0), (0.8, 0.0)]), Verdict::Starved(2)),
            (chain(&[(0.6, 0.0), (0.9, 0.0)]), Verdict::Starved(1)),
            (chain(&[(0.0, 0.9), (0.0, 0.7)]), Verdict::Blocked(2)),
            // Upstream queues full is prefetching, not a bottleneck.
            (chain(&[(0.0, 0.9), (0.0, 0.0)]), Verdict::Balanced),
        ];
        for (s, want) in cases {
            let mut v = VerdictTracker::default();
            for _ in 0..HOLD_TICKS + 1 {
                v.update(&s);
            }
            assert_eq!(v.shown(), want, "{s:?}");
        }
    }
}
