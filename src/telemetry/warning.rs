//! A warning as data: its rule, its severity and the warning itself, as the snapshots carry them
//! (the rules that raise them live in `telemetry::warnings`).

use serde::{Deserialize, Serialize};

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

    pub(super) fn default_severity(self) -> Severity {
        match self {
            Rule::Stalled => Severity::Error,
            Rule::Blocked => Severity::Info,
            _ => Severity::Warn,
        }
    }
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
