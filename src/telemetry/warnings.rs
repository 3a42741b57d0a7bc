//! Warnings as data (tokio-console's lints): rules over the stream of snapshots, each warning
//! with a severity, the evidence and the fix in one line. A rule whose data is absent (no GPU,
//! profiling off, a producer that does not count host syncs, no allocator figures) stays silent,
//! so that a new rule slots in beside these without touching them: a new `Rule` variant, its
//! name, and one function in `Warnings::candidates`.
//!
//! A condition must hold for its rule's `*_s` seconds before it shows; it disappears the tick it
//! stops holding. Thresholds, rules switched off and severities come from `[warnings]` in the
//! TOML run configuration (`WarnConfig`).

use super::phase::Phase;
use super::phase::Role;
use super::snapshot::{Snapshot, ThreadState};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warn,
    Error,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<Severity> {
        [Severity::Info, Severity::Warn, Severity::Error]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// A stage waits on its empty input queue.
    Starved,
    /// The producers of the last queue wait on it full.
    Blocked,
    /// No step has ended for several step times.
    Stalled,
    /// A GPU sits idle while work is queued for a worker on it.
    GpuIdle,
    /// A queue runs empty and full within a window: too small for its producer's jitter.
    QueueJitter,
    /// The profiler costs more than its budget.
    ProfilingCost,
    /// Step records (or trace spans) dropped.
    Dropped,
    /// A thread spends a share of its time in host syncs (where the producer times them: a
    /// Python pipeline's `sync` phase), or a thread on a GPU reads the device back more times a
    /// step than its budget (where the producer counts them: our engine).
    HostSync,
    /// The caching allocator allocates and frees device memory every step, or retries.
    AllocChurn,
    /// A stage's batches change shape (size) from step to step.
    ShapesVary,
}

impl Rule {
    pub const ALL: [Rule; 10] = [
        Rule::Starved,
        Rule::Blocked,
        Rule::Stalled,
        Rule::GpuIdle,
        Rule::QueueJitter,
        Rule::ProfilingCost,
        Rule::Dropped,
        Rule::HostSync,
        Rule::AllocChurn,
        Rule::ShapesVary,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::Starved => "starved",
            Rule::Blocked => "blocked",
            Rule::Stalled => "stalled",
            Rule::GpuIdle => "gpu_idle",
            Rule::QueueJitter => "queue_jitter",
            Rule::ProfilingCost => "profiling_cost",
            Rule::Dropped => "dropped",
            Rule::HostSync => "host_sync",
            Rule::AllocChurn => "alloc_churn",
            Rule::ShapesVary => "shapes_vary",
        }
    }

    /// What the rule watches, in a few words (the warnings view's rule table).
    pub fn watches(self) -> &'static str {
        match self {
            Rule::Starved => "a stage waiting on its empty input queue",
            Rule::Blocked => "the producers of the last queue waiting on it full",
            Rule::Stalled => "no step ending for several step times",
            Rule::GpuIdle => "a GPU idle while work is queued for it",
            Rule::QueueJitter => "a queue empty and full within a window",
            Rule::ProfilingCost => "the profiler's own cost over its budget",
            Rule::Dropped => "step records or trace spans dropped",
            Rule::HostSync => "host syncs inside a step (where they are counted)",
            Rule::AllocChurn => "device allocations and frees every step, or retries",
            Rule::ShapesVary => "a stage's batch shape changing step to step",
        }
    }

    pub fn parse(s: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == s)
    }

    fn default_severity(self) -> Severity {
        match self {
            Rule::Stalled => Severity::Error,
            Rule::Blocked => Severity::Info,
            _ => Severity::Warn,
        }
    }
}

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

/// One warning in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Warning {
    pub rule: Rule,
    /// What it is about: a thread, a role, a queue, a GPU.
    pub subject: String,
    pub severity: Severity,
    /// What was measured, in one line.
    pub evidence: String,
    /// What to do about it, in one line.
    pub fix: String,
    /// How long the condition has held, seconds.
    pub for_s: f64,
}

impl Warning {
    /// `starved:drafter`, the form the headless lines list.
    pub fn key(&self) -> String {
        format!("{}:{}", self.rule.name(), self.subject)
    }
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
