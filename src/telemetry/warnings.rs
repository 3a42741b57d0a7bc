//! Warnings as data (tokio-console's lints): rules over the stream of snapshots, each warning
//! with a severity, the evidence and the fix in one line. A rule whose data is absent (no GPU,
//! profiling off, a producer that does not count host syncs, no allocator figures) stays silent,
//! so that a new rule slots in beside these without touching them: a new `Rule` variant and its
//! name (`telemetry::warning`), and one function in `Warnings::candidates`.
//!
//! A condition must hold for its rule's `*_s` seconds before it shows; it disappears the tick it
//! stops holding. Thresholds, rules switched off and severities come from `[warnings]` in the
//! TOML run configuration (`WarnConfig`).

use super::phase::Phase;
use super::phase::Role;
use super::snapshot::{Snapshot, ThreadState};
pub use super::warning::{Rule, Severity, Warning};
use std::collections::HashMap;

/// Steps each worker on a GPU must have ended before the device rules (`gpu_idle`,
/// `alloc_churn`) judge it: the first steps load kernels, fill the allocator's cache and capture
/// CUDA graphs, with batches already queued, which is start-up, not a fault.
pub const WARMUP_STEPS: u64 = 5;

/// Steps ended so far by the least advanced and the busiest worker on `cuda:N` (threads that
/// exited left out); None where none runs there.
fn steps_on(s: &Snapshot, cuda: u32) -> Option<(u64, u64)> {
    let device = format!("cuda:{cuda}");
    s.threads
        .iter()
        .filter(|t| t.device == device && t.role != Role::Hub && t.state != ThreadState::Exited)
        .map(|t| t.run.steps)
        .fold(None, |m: Option<(u64, u64)>, n| {
            Some(m.map_or((n, n), |(lo, hi)| (lo.min(n), hi.max(n))))
        })
}

/// A condition that holds this tick: (rule, subject) -> evidence and fix.
struct Candidate {
    rule: Rule,
    subject: String,
    evidence: String,
    fix: String,
}

/// The rules' state over the snapshots seen so far.
#[derive(Clone, Debug)]
pub struct Warnings {
    pub config: WarnConfig,
    /// Which phases are host syncs (`host_sync`) besides the one named `sync` in the snapshot's
    /// names, the phase the Python client times `.item()`, `.cpu()`, `torch.cuda.synchronize`
    /// in; none by default.
    pub is_sync: fn(Phase) -> bool,
    /// When each condition began holding (elapsed s).
    since: HashMap<(Rule, String), f64>,
    /// Per queue: its samples over the `queue_jitter` window.
    jitter: HashMap<String, jitter::JitterSamples>,
    /// The dropped record and span counts of the last snapshot.
    drops: Option<(u64, u64)>,
    /// Per count: when it last grew (elapsed s) and what it was when the window began.
    last_drop: [Option<(f64, u64)>; 2],
    /// Per CUDA device: the allocator's counts over the `alloc_churn` window, oldest first.
    alloc: HashMap<u32, std::collections::VecDeque<alloc::AllocPoint>>,
    /// Per CUDA device: its utilisation over the `gpu_idle` window.
    gpu_util: HashMap<u32, gpu_idle::UtilSamples>,
}

impl Warnings {
    pub fn new(config: WarnConfig) -> Warnings {
        Warnings {
            config,
            is_sync: |_| false,
            since: HashMap::new(),
            jitter: HashMap::new(),
            drops: None,
            last_drop: [None; 2],
            alloc: HashMap::new(),
            gpu_util: HashMap::new(),
        }
    }

    /// The warnings in force at `s`, most severe first.
    pub fn check(&mut self, s: &Snapshot) -> Vec<Warning> {
        let now = s.elapsed_s;
        let found: Vec<Candidate> = self
            .candidates(s)
            .into_iter()
            .filter(|c| self.config.on(c.rule))
            .collect();
        self.since
            .retain(|k, _| found.iter().any(|c| c.rule == k.0 && c.subject == k.1));
        let mut out = Vec::new();
        for c in found {
            let since = *self.since.entry((c.rule, c.subject.clone())).or_insert(now);
            let held = now - since;
            if held + 1e-9 >= self.config.hold_s(c.rule) {
                out.push(Warning {
                    rule: c.rule,
                    severity: self.config.severity(c.rule),
                    subject: c.subject,
                    evidence: c.evidence,
                    fix: c.fix,
                    for_s: held,
                });
            }
        }
        out.sort_by(|a, b| (b.severity, a.rule, &a.subject).cmp(&(a.severity, b.rule, &b.subject)));
        out
    }
}

/// Counts by severity: (error, warn, info).
pub fn counts(w: &[Warning]) -> (usize, usize, usize) {
    let n = |s| w.iter().filter(|x| x.severity == s).count();
    (n(Severity::Error), n(Severity::Warn), n(Severity::Info))
}

mod alloc;
mod gpu_idle;
mod jitter;
mod rules;
mod shapes;
mod thresholds;
pub use thresholds::WarnConfig;

#[cfg(test)]
mod tests;
