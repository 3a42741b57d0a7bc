//! What the front-end keeps of the snapshots it got, beyond the latest: the last seconds of
//! steps (the timeline and `e` read them), the verdict changes, each thread's CPU samples. A
//! freeze keeps a copy whole.

use super::segments::Segments;
use crate::telemetry::snapshot::StepSpan;
use crate::telemetry::verdict::Verdict;
use crate::telemetry::window::push_capped;
use crate::telemetry::Snapshot;
use std::collections::{HashMap, VecDeque};

/// What the timeline can show and `e` exports at most: the last seconds of phases.
pub const TRACE_SECONDS: f64 = 10.0;
/// CPU samples kept per thread (a minute at 10 snapshots a second).
const CPU_HISTORY: usize = 600;
/// Verdict changes kept for the timeline.
const MAX_VERDICT_CHANGES: usize = 256;

/// What the front-end keeps of the snapshots it got: the last `TRACE_SECONDS` of steps (as spans
/// and as per-thread phase segments), the verdict changes, each thread's CPU samples.
#[derive(Clone, Default)]
pub struct History {
    /// Step spans of the last `TRACE_SECONDS`: the timeline and `e`.
    pub spans: VecDeque<StepSpan>,
    /// The same steps as per-thread phase segments: what the timeline draws from.
    pub segments: Segments,
    /// Verdict changes, (hub clock ns, new verdict), oldest first; the timeline marks them.
    pub verdicts: VecDeque<(u64, Verdict)>,
    /// CPU % per thread, one value a snapshot, oldest first (the threads view's detail).
    pub cpu: HashMap<String, VecDeque<f32>>,
}

impl History {
    /// Adds what snapshot `s` brings, and drops what has aged out.
    pub(super) fn record(&mut self, s: &Snapshot) {
        if self.verdicts.back().map(|v| v.1) != Some(s.verdict) {
            push_capped(
                &mut self.verdicts,
                (s.now_ns, s.verdict),
                MAX_VERDICT_CHANGES,
            );
        }
        for t in &s.threads {
            if let Some(pct) = t.cpu_pct {
                let h = match self.cpu.get_mut(&t.name) {
                    Some(h) => h,
                    None => self.cpu.entry(t.name.clone()).or_default(),
                };
                push_capped(h, pct, CPU_HISTORY);
            }
        }
        self.spans.extend(s.steps.iter().cloned());
        for step in &s.steps {
            self.segments.push(step);
        }
        if let Some(end) = self.spans.back().map(|x| x.end_ns) {
            let from = end.saturating_sub((TRACE_SECONDS * 1e9) as u64);
            while self.spans.front().is_some_and(|x| x.end_ns < from) {
                self.spans.pop_front();
            }
            if !s.steps.is_empty() {
                self.segments.trim(from);
            }
        }
    }
}
