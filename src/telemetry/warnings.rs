//! Warnings as data (tokio-console's lints): rules over the stream of snapshots, each warning
//! with a severity, the evidence and the fix in one line. A rule whose data is absent (no GPU,
//! profiling off, a producer that does not count host syncs) stays silent, so that rules for
//! host syncs or allocator churn slot in beside these without touching them: a new `Rule`
//! variant, its name, and one function in `Warnings::candidates`.
//!
//! A condition must hold for its rule's `*_s` seconds before it shows; it disappears the tick it
//! stops holding. Thresholds, rules switched off and severities come from `[warnings]` in the
//! TOML run configuration (`WarnConfig`).

use super::snapshot::{GpuPanel, QueueView, Snapshot, ThreadView};
use super::verdict::ENTER;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

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
}

impl Rule {
    pub const ALL: [Rule; 7] = [
        Rule::Starved,
        Rule::Blocked,
        Rule::Stalled,
        Rule::GpuIdle,
        Rule::QueueJitter,
        Rule::ProfilingCost,
        Rule::Dropped,
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
    /// `gpu_idle`: a GPU below this utilisation, percent, while work is queued for it.
    pub gpu_idle_pct: f64,
    pub gpu_idle_s: f64,
    /// `queue_jitter`: both sides must wait at least this share of time within the window.
    pub jitter_wait_share: f64,
    /// `queue_jitter`: the window in which the queue must run both empty and full, seconds.
    pub jitter_window_s: f64,
    /// `profiling_cost`: the budget, percent of a worker's (or the hub's) time.
    pub profiling_budget_pct: f64,
    pub profiling_s: f64,
    /// `dropped`: a drop in this many last seconds keeps the warning up.
    pub dropped_window_s: f64,
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
        ];
        for (k, v) in seconds {
            if !(v >= 0.0 && v.is_finite()) {
                return Err(format!(
                    "`warnings.{k}` {v} is not a duration: give seconds, 0 or more"
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

    fn on(&self, rule: Rule) -> bool {
        !self.off.iter().any(|n| n == rule.name())
    }

    fn severity(&self, rule: Rule) -> Severity {
        self.severity
            .get(rule.name())
            .and_then(|s| Severity::parse(s))
            .unwrap_or(rule.default_severity())
    }

    fn hold_s(&self, rule: Rule) -> f64 {
        match rule {
            Rule::Starved => self.starved_s,
            Rule::Blocked => self.blocked_s,
            Rule::Stalled => self.stalled_s,
            Rule::GpuIdle => self.gpu_idle_s,
            Rule::ProfilingCost => self.profiling_s,
            Rule::QueueJitter | Rule::Dropped => 0.0,
        }
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
#[derive(Clone, Debug, Default)]
pub struct Warnings {
    pub config: WarnConfig,
    /// When each condition began holding (elapsed s).
    since: HashMap<(Rule, String), f64>,
    /// Per queue: when it last ran empty with its consumers waiting, and full with its
    /// producers waiting.
    jitter: HashMap<String, (Option<f64>, Option<f64>)>,
    /// The dropped record and span counts of the last snapshot.
    drops: Option<(u64, u64)>,
    /// Per count: when it last grew (elapsed s) and what it was when the window began.
    last_drop: [Option<(f64, u64)>; 2],
}

impl Warnings {
    pub fn new(config: WarnConfig) -> Warnings {
        Warnings {
            config,
            ..Warnings::default()
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

    fn candidates(&mut self, s: &Snapshot) -> Vec<Candidate> {
        let mut out = Vec::new();
        if s.paused {
            // Time neither works nor waits while paused: nothing to judge but drops.
            self.dropped(s, &mut out);
            return out;
        }
        self.starved(s, &mut out);
        self.blocked(s, &mut out);
        stalled(s, &mut out);
        self.gpu_idle(s, &mut out);
        self.queue_jitter(s, &mut out);
        self.profiling_cost(s, &mut out);
        self.dropped(s, &mut out);
        out
    }

    fn starved(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        for q in &s.queues {
            if q.consumer_wait_share <= self.config.starved_share || s.stall.is_some() {
                continue;
            }
            out.push(Candidate {
                rule: Rule::Starved,
                subject: q.consumers.clone(),
                evidence: format!(
                    "{} wait on empty queue `{}` {:.0}% of the time (depth {}/{}); {}",
                    plural(&q.consumers),
                    q.name,
                    q.consumer_wait_share * 100.0,
                    q.depth,
                    q.capacity,
                    side(s, &q.producers),
                ),
                fix: format!(
                    "the {} side is the bottleneck: give it more workers or devices, or look at \
                     its phases (view 3)",
                    q.producers
                ),
            });
        }
    }

    fn blocked(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        // Upstream queues full is prefetching doing its job: only the last queue counts (as for
        // the verdict).
        let Some(q) = last_queue(&s.queues) else {
            return;
        };
        if q.producer_wait_share <= self.config.blocked_share || s.stall.is_some() {
            return;
        }
        out.push(Candidate {
            rule: Rule::Blocked,
            subject: q.producers.clone(),
            evidence: format!(
                "{} wait on full queue `{}` {:.0}% of the time (depth {}/{}); {}",
                plural(&q.producers),
                q.name,
                q.producer_wait_share * 100.0,
                q.depth,
                q.capacity,
                side(s, &q.consumers),
            ),
            fix: format!(
                "the {} side is the bottleneck and the {} side has time to spare: move a device \
                 from {} to {}",
                q.consumers, q.producers, q.producers, q.consumers
            ),
        });
    }

    fn gpu_idle(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let GpuPanel::Present(gpus) = &s.gpus else {
            return;
        };
        for g in gpus {
            let Some(n) = g.cuda else { continue };
            if g.util_pct as f64 >= self.config.gpu_idle_pct {
                continue;
            }
            let device = format!("cuda:{n}");
            // A worker on this GPU with work waiting in its input queue.
            let waiting = s
                .threads
                .iter()
                .filter(|t| t.device == device)
                .find_map(|t| {
                    let q = s
                        .queues
                        .iter()
                        .find(|q| q.consumers == t.role.name() && q.depth > 0)?;
                    Some((t, q))
                });
            let Some((t, q)) = waiting else { continue };
            out.push(Candidate {
                rule: Rule::GpuIdle,
                subject: device.clone(),
                evidence: format!(
                    "{device} at {}% utilisation while queue `{}` holds {}/{} for {} (in {})",
                    g.util_pct,
                    q.name,
                    q.depth,
                    q.capacity,
                    t.name,
                    t.phase.name()
                ),
                fix: format!(
                    "{} is host-bound: look at its phases (view 2) for launch overhead or host \
                     syncs; a larger batch or CUDA graphs keep the GPU fed",
                    t.name
                ),
            });
        }
    }

    fn queue_jitter(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let now = s.elapsed_s;
        let window = self.config.jitter_window_s;
        let share = self.config.jitter_wait_share;
        for q in &s.queues {
            let seen = self.jitter.entry(q.name.clone()).or_default();
            if q.min_depth == 0 && q.consumer_wait_share > share {
                seen.0 = Some(now);
            }
            if q.capacity > 0 && q.max_depth >= q.capacity && q.producer_wait_share > share {
                seen.1 = Some(now);
            }
            let recent = |t: Option<f64>| t.is_some_and(|t| now - t <= window);
            if !(recent(seen.0) && recent(seen.1)) || s.stall.is_some() {
                continue;
            }
            let key = match q.name.as_str() {
                "batch" | "hs" => format!("`{}_queue` in the TOML config", q.name),
                _ => "its capacity".to_string(),
            };
            out.push(Candidate {
                rule: Rule::QueueJitter,
                subject: q.name.clone(),
                evidence: format!(
                    "queue `{}` ({} slots) ran empty ({} waiting {:.0}%) and full ({} waiting \
                     {:.0}%) within {window:.0} s",
                    q.name,
                    q.capacity,
                    q.consumers,
                    q.consumer_wait_share * 100.0,
                    q.producers,
                    q.producer_wait_share * 100.0,
                ),
                fix: format!(
                    "the queue is too small for the {} side's jitter: raise {key} to {}",
                    q.producers,
                    (q.capacity * 2).max(2)
                ),
            });
        }
    }

    fn profiling_cost(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        if !s.profiling {
            return;
        }
        let c = &s.self_cost;
        let workers = s.threads.len().max(1) as f64;
        // Mark time as a share of each worker's time; snapshot time as a share of the hub's
        // (one snapshot a tick of 100 ms).
        let marks_pct = c.marks_per_s * c.ns_per_mark / 1e9 / workers * 100.0;
        let hub_pct = c.snapshot_us / 1e5 * 100.0;
        let budget = self.config.profiling_budget_pct;
        if marks_pct <= budget && hub_pct <= budget {
            return;
        }
        out.push(Candidate {
            rule: Rule::ProfilingCost,
            subject: if marks_pct > budget { "marks" } else { "hub" }.into(),
            evidence: format!(
                "phase marks take {marks_pct:.1}% of each worker's time ({:.0} ns x {:.0}/s), \
                 snapshots {hub_pct:.1}% of the hub's ({:.0} us each); budget {budget}%",
                c.ns_per_mark, c.marks_per_s, c.snapshot_us
            ),
            fix: "press p (or --profiling off) to stop marking; step counts and tok/s stay".into(),
        });
    }

    fn dropped(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let now = s.elapsed_s;
        let counts = (s.self_cost.dropped, s.self_cost.spans_dropped);
        let before = self.drops.replace(counts).unwrap_or((0, 0));
        for (i, (n, was)) in [(counts.0, before.0), (counts.1, before.1)]
            .into_iter()
            .enumerate()
        {
            if n > was {
                let base = self.last_drop[i]
                    .filter(|(t, _)| now - t <= self.config.dropped_window_s)
                    .map(|(_, b)| b)
                    .unwrap_or(was);
                self.last_drop[i] = Some((now, base));
            }
            let Some((t, base)) = self.last_drop[i] else {
                continue;
            };
            if now - t > self.config.dropped_window_s {
                self.last_drop[i] = None;
                continue;
            }
            let (subject, what, fix) = match i {
                0 => (
                    "records",
                    "step records",
                    "the hub falls behind its workers: fewer workers, or profiling off (p)",
                ),
                _ => (
                    "spans",
                    "trace spans",
                    "more steps end per snapshot than traces keep: the timeline and exports have \
                     gaps",
                ),
            };
            out.push(Candidate {
                rule: Rule::Dropped,
                subject: subject.into(),
                evidence: format!(
                    "{} {what} dropped in the last {:.0} s ({n} in all)",
                    n - base,
                    self.config.dropped_window_s
                ),
                fix: fix.into(),
            });
        }
    }
}

fn stalled(s: &Snapshot, out: &mut Vec<Candidate>) {
    let Some(what) = &s.stall else { return };
    let thread = what.split_whitespace().next().unwrap_or("pipeline");
    out.push(Candidate {
        rule: Rule::Stalled,
        subject: thread.to_string(),
        evidence: format!("no step has ended: {what}"),
        fix: format!(
            "see where {thread} hangs (py-spy dump / gdb on the thread); a hung device, a \
             deadlock or a slow data source"
        ),
    });
}

/// The queue the verdict judges blocking on: the one whose producers rank last.
fn last_queue(queues: &[QueueView]) -> Option<&QueueView> {
    queues.iter().max_by_key(|q| {
        super::stages::role_named(&q.producers)
            .map(|r| r.rank())
            .unwrap_or(0)
    })
}

fn plural(role: &str) -> String {
    format!("{role}s")
}

/// What the threads of a role are doing now: "target-0 in forward 1.2 s".
fn side(s: &Snapshot, role: &str) -> String {
    let threads: Vec<&ThreadView> = s.threads.iter().filter(|t| t.role.name() == role).collect();
    if threads.is_empty() {
        return format!("no {role} thread seen");
    }
    threads
        .iter()
        .map(|t| format!("{} in {} {:.1} s", t.name, t.phase.name(), t.phase_s))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Counts by severity: (error, warn, info).
pub fn counts(w: &[Warning]) -> (usize, usize, usize) {
    let n = |s| w.iter().filter(|x| x.severity == s).count();
    (n(Severity::Error), n(Severity::Warn), n(Severity::Info))
}

#[cfg(test)]
mod tests;
