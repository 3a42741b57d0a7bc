//! Each thread's phase segments of the last seconds: what the front-end keeps of the step
//! spans for the timeline to draw from (timeline.rs maps them to columns).

use crate::telemetry::snapshot::StepSpan;
use crate::telemetry::Phase;
use std::collections::{HashMap, VecDeque};

/// One stretch of one phase of one thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    pub start_ns: u64,
    pub end_ns: u64,
    pub phase: Phase,
}

/// Each thread's phase segments of the last seconds, oldest first, in one contiguous run per
/// thread: a frame reads only the visible threads' segments inside the span (no hashing or
/// pointer chasing per step).
#[derive(Clone, Debug, Default)]
pub struct Segments {
    by_thread: HashMap<String, VecDeque<Segment>>,
}

impl Segments {
    /// Adds a step's phases, laid out in its role's order ending at its end (as traces do).
    pub fn push(&mut self, s: &StepSpan) {
        let q = match self.by_thread.get_mut(&s.thread) {
            Some(q) => q,
            None => self.by_thread.entry(s.thread.clone()).or_default(),
        };
        let mut t = s.end_ns.saturating_sub(s.wall_ns);
        for (phase, ns) in &s.phases {
            q.push_back(Segment {
                start_ns: t,
                end_ns: t + ns,
                phase: *phase,
            });
            t += ns;
        }
    }

    /// Drops the segments that ended before `from_ns`.
    pub fn trim(&mut self, from_ns: u64) {
        for q in self.by_thread.values_mut() {
            while q.front().is_some_and(|s| s.end_ns < from_ns) {
                q.pop_front();
            }
        }
    }

    pub fn of(&self, thread: &str) -> Option<&VecDeque<Segment>> {
        self.by_thread.get(thread)
    }

    /// The oldest time kept.
    pub fn oldest_ns(&self) -> Option<u64> {
        self.by_thread
            .values()
            .filter_map(|q| q.front().map(|s| s.start_ns))
            .min()
    }

    /// A thread's segments from the first that ends after `from_ns` (the caller stops at the
    /// first that starts after its span).
    pub(super) fn starting_in(
        &self,
        thread: &str,
        from_ns: u64,
    ) -> std::collections::vec_deque::Iter<'_, Segment> {
        match self.of(thread) {
            Some(q) => after(q, from_ns),
            None => Default::default(),
        }
    }
}

/// The segments of `q` from the first that ends after `from_ns`.
pub(super) fn after(
    q: &VecDeque<Segment>,
    from_ns: u64,
) -> std::collections::vec_deque::Iter<'_, Segment> {
    q.range(q.partition_point(|s| s.end_ns <= from_ns)..)
}
