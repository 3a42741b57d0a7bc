//! Which stage starves: a verdict from queue wait shares, with hysteresis so that it does not
//! flicker. A state is entered above `ENTER`, left below `EXIT`, and a change must hold for a
//! dwell (`DWELL_NS`, 3 s unless the run's TOML sets `verdict_dwell`) before it is shown: a
//! loaded host whose waits wobble around the thresholds keeps one verdict.

use super::phase::Role;
use serde::{Deserialize, Serialize};

pub const ENTER: f64 = 0.30;
pub const EXIT: f64 = 0.15;
/// How long a new verdict's evidence must hold, unbroken, before it is shown.
pub const DWELL_NS: u64 = 3_000_000_000;

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
    /// The verdict in words; a declared stage's verdict names its stages through the pipeline's
    /// `Names` (`Names::verdict`), here only `starved` / `blocked`.
    pub fn text(self) -> &'static str {
        match self {
            Verdict::Warmup => "warming up",
            Verdict::Balanced => "balanced",
            Verdict::LoaderBound => "targets starved: loader-bound",
            Verdict::TargetBound => "drafters starved: target-bound",
            Verdict::DrafterBound => "targets blocked on HS queue: drafter-bound",
            Verdict::Paused => "paused",
            Verdict::Stalled => "stalled",
            Verdict::Starved(_) => "starved",
            Verdict::Blocked(_) => "blocked",
        }
    }

    /// How much a verdict asks for attention, for the worst of several ranks: a stall first,
    /// then a bottleneck, a pause, warming up, and balanced last.
    pub fn severity(self) -> u8 {
        match self {
            Verdict::Balanced => 0,
            Verdict::Warmup => 1,
            Verdict::Paused => 2,
            Verdict::Stalled => 4,
            Verdict::LoaderBound
            | Verdict::TargetBound
            | Verdict::DrafterBound
            | Verdict::Starved(_)
            | Verdict::Blocked(_) => 3,
        }
    }

    /// The verdict in a word or two (`Names::verdict_short` for a declared stage's).
    pub fn short(self) -> &'static str {
        match self {
            Verdict::Warmup => "warmup",
            Verdict::Balanced => "balanced",
            Verdict::LoaderBound => "loader-bound",
            Verdict::TargetBound => "target-bound",
            Verdict::DrafterBound => "drafter-bound",
            Verdict::Paused => "paused",
            Verdict::Stalled => "stalled",
            Verdict::Starved(_) => "starved",
            Verdict::Blocked(_) => "blocked",
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

#[derive(Clone, Debug)]
pub struct VerdictTracker {
    shown: Verdict,
    candidate: Verdict,
    /// When the candidate's evidence began (hub clock, ns).
    since_ns: u64,
    dwell_ns: u64,
}

impl Default for VerdictTracker {
    fn default() -> Self {
        VerdictTracker::with_dwell(DWELL_NS)
    }
}

impl VerdictTracker {
    /// A tracker whose changes must hold for `dwell_ns` (0: at once).
    pub fn with_dwell(dwell_ns: u64) -> Self {
        VerdictTracker {
            shown: Verdict::Warmup,
            candidate: Verdict::Warmup,
            since_ns: 0,
            dwell_ns,
        }
    }

    pub fn dwell_ns(&self) -> u64 {
        self.dwell_ns
    }

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

    /// Feeds one tick's shares at `now_ns`; returns the verdict to show. The first verdict
    /// after warming up is shown at once; a later change once its evidence has held for the
    /// dwell, every tick in between.
    pub fn update(&mut self, s: &WaitShares, now_ns: u64) -> Verdict {
        let raw = self.classify(s);
        if raw == self.shown {
            self.candidate = raw;
            return self.shown;
        }
        if raw != self.candidate {
            self.candidate = raw;
            self.since_ns = now_ns;
        }
        if now_ns.saturating_sub(self.since_ns) >= self.dwell_ns || self.shown == Verdict::Warmup {
            self.shown = raw;
        }
        self.shown
    }

    /// A tick that is not judged (paused, stalled): evidence gathered before it does not
    /// count towards a change after it.
    pub fn interrupt(&mut self) {
        self.candidate = self.shown;
    }

    /// Starts over (warming up), keeping the dwell.
    pub fn reset(&mut self) {
        *self = VerdictTracker::with_dwell(self.dwell_ns);
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
            for k in 0..40 {
                v.update(&s, k * 100_000_000);
            }
            assert_eq!(v.shown(), want, "{s:?}");
        }
    }
}
