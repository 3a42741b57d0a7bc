//! `[warnings]` of the TOML run configuration: thresholds, rules switched off, severities,
//! with documented defaults; a value out of range is a sentence naming its key.

use super::{Rule, Severity};
use crate::telemetry::verdict::ENTER;
use serde::Deserialize;
use std::collections::BTreeMap;

/// `[warnings]` in the TOML run configuration. Every key optional; an unknown one is an error.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WarnConfig {
    /// `starved`: the consumers' share of time waiting on an empty queue, 0..1.
    pub starved_share: f64,
    /// `starved`: seconds it must hold.
    pub starved_s: f64,
    /// `blocked`: the producers' share of time waiting on a full last queue, 0..1.
    pub blocked_share: f64,
    pub blocked_s: f64,
    /// `stalled`: seconds the stall must last beyond the hub's own stall threshold.
    pub stalled_s: f64,
    /// `gpu_idle`: a GPU below this utilisation, percent, on average over `gpu_idle_s` seconds,
    /// while work is queued for it.
    pub gpu_idle_pct: f64,
    pub gpu_idle_s: f64,
    /// `queue_jitter`: both sides must wait at least this share of time within the window (the
    /// window's mean).
    pub jitter_wait_share: f64,
    /// `queue_jitter`: the window in which the queue must run both empty and full, seconds.
    pub jitter_window_s: f64,
    /// `profiling_cost`: the budget, percent of a worker's (or the hub's) time.
    pub profiling_budget_pct: f64,
    pub profiling_s: f64,
    /// `dropped`: a drop in this many last seconds keeps the warning up.
    pub dropped_window_s: f64,
    /// `host_sync`: a thread's share of time in counted host syncs (10 s window), 0..1.
    pub host_sync_share: f64,
    pub host_sync_s: f64,
    /// `host_sync`: host syncs a step (10 s window) a thread on a GPU may make where the producer
    /// counts them (our engine reads its step's figures back once, in `metrics`).
    pub host_syncs_per_step: f64,
    /// `alloc_churn`: device allocations plus frees a step (over the window) that count as
    /// churn.
    pub alloc_churn_per_step: f64,
    /// `alloc_churn`: the window the churn and the retries are counted over, seconds.
    pub alloc_window_s: f64,
    pub alloc_churn_s: f64,
    /// `shapes_vary`: different batch sizes among a thread's last 16 steps that count as shapes
    /// varying, 2 to 16 (a run padding to fewer bucket lengths stays below the default).
    pub shapes_distinct: u32,
    pub shapes_s: f64,
    /// Rules switched off, by name.
    pub off: Vec<String>,
    /// Severities that replace the rules' own: `starved = "error"`.
    pub severity: BTreeMap<String, String>,
}

impl Default for WarnConfig {
    fn default() -> Self {
        WarnConfig {
            starved_share: ENTER,
            starved_s: 10.0,
            blocked_share: ENTER,
            blocked_s: 30.0,
            stalled_s: 0.0,
            gpu_idle_pct: 20.0,
            gpu_idle_s: 10.0,
            jitter_wait_share: 0.05,
            jitter_window_s: 10.0,
            profiling_budget_pct: 2.0,
            profiling_s: 5.0,
            dropped_window_s: 10.0,
            host_sync_share: 0.10,
            host_sync_s: 10.0,
            host_syncs_per_step: 2.0,
            alloc_churn_per_step: 1.0,
            alloc_window_s: 10.0,
            alloc_churn_s: 0.0,
            shapes_distinct: 8,
            shapes_s: 5.0,
            off: Vec::new(),
            severity: BTreeMap::new(),
        }
    }
}

impl WarnConfig {
    /// A sentence naming the key and the range when a value is out of it.
    pub fn check(&self) -> Result<(), String> {
        let shares = [
            ("starved_share", self.starved_share),
            ("blocked_share", self.blocked_share),
            ("jitter_wait_share", self.jitter_wait_share),
            ("host_sync_share", self.host_sync_share),
        ];
        for (k, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("`warnings.{k}` {v} is out of range: use 0 to 1"));
            }
        }
        let seconds = [
            ("starved_s", self.starved_s),
            ("blocked_s", self.blocked_s),
            ("stalled_s", self.stalled_s),
            ("gpu_idle_s", self.gpu_idle_s),
            ("jitter_window_s", self.jitter_window_s),
            ("profiling_s", self.profiling_s),
            ("dropped_window_s", self.dropped_window_s),
            ("host_sync_s", self.host_sync_s),
            ("alloc_window_s", self.alloc_window_s),
            ("alloc_churn_s", self.alloc_churn_s),
            ("shapes_s", self.shapes_s),
        ];
        for (k, v) in seconds {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!(
                    "`warnings.{k}` {v} is not a duration: give seconds, 0 or more"
                ));
            }
        }
        let counts = [
            ("host_syncs_per_step", self.host_syncs_per_step),
            ("alloc_churn_per_step", self.alloc_churn_per_step),
        ];
        for (k, v) in counts {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!(
                    "`warnings.{k}` {v} is not a count: give a number, 0 or more"
                ));
            }
        }
        for (k, v) in [
            ("gpu_idle_pct", self.gpu_idle_pct),
            ("profiling_budget_pct", self.profiling_budget_pct),
        ] {
            if !(0.0..=100.0).contains(&v) {
                return Err(format!("`warnings.{k}` {v} is out of range: use 0 to 100"));
            }
        }
        let most = crate::telemetry::stall::SIZE_STEPS as u32;
        if !(2..=most).contains(&self.shapes_distinct) {
            return Err(format!(
                "`warnings.shapes_distinct` {} is out of range: use 2 to {most}",
                self.shapes_distinct
            ));
        }
        self.check_rules()
    }

    /// The rules named in `off` and `severity` exist, and each severity is one.
    fn check_rules(&self) -> Result<(), String> {
        let names = || {
            Rule::ALL
                .iter()
                .map(|r| r.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for name in &self.off {
            if Rule::parse(name).is_none() {
                return Err(format!(
                    "`warnings.off` names an unknown rule `{name}`: use {}",
                    names()
                ));
            }
        }
        for (name, level) in &self.severity {
            if Rule::parse(name).is_none() {
                return Err(format!(
                    "`warnings.severity.{name}`: unknown rule `{name}`: use {}",
                    names()
                ));
            }
            if Severity::parse(level).is_none() {
                return Err(format!(
                    "`warnings.severity.{name}` = \"{level}\": use info, warn or error"
                ));
            }
        }
        Ok(())
    }

    pub(super) fn on(&self, rule: Rule) -> bool {
        !self.off.iter().any(|n| n == rule.name())
    }

    pub(super) fn severity(&self, rule: Rule) -> Severity {
        self.severity
            .get(rule.name())
            .and_then(|s| Severity::parse(s))
            .unwrap_or(rule.default_severity())
    }

    pub(super) fn hold_s(&self, rule: Rule) -> f64 {
        match rule {
            Rule::Starved => self.starved_s,
            Rule::Blocked => self.blocked_s,
            Rule::Stalled => self.stalled_s,
            // Judged over its window (warnings/gpu_idle.rs), held no longer.
            Rule::GpuIdle => 0.0,
            Rule::ProfilingCost => self.profiling_s,
            Rule::HostSync => self.host_sync_s,
            Rule::AllocChurn => self.alloc_churn_s,
            Rule::ShapesVary => self.shapes_s,
            Rule::QueueJitter | Rule::Dropped => 0.0,
        }
    }
}

#[cfg(test)]
mod tests;
