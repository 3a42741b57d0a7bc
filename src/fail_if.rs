//! `--fail-if EXPR`: CI gates over the snapshots of a headless run (`train`, `attach`). When one
//! holds, the run stops the way a normal stop does, the reason is printed as one line and the
//! process exits with `EXIT_CODE`.
//!
//! Forms: `METRIC OP NUMBER` (`tok/s<12000`, `gpu_idle>20%`, `loss>4`, `tau<1.5`,
//! `dropped>0`), `verdict=NAME` or `verdict!=NAME` (a verdict's short name, or `starved` /
//! `blocked` for any of those), `warn>=SEVERITY` (`info`, `warn`, `error`); each optionally
//! followed by `after DURATION` (not judged before the run is that old) and `for DURATION` (must
//! hold that long without a break). A metric the run does not have (no GPU, no loss yet) never
//! holds.

use crate::telemetry::names::Names;
use crate::telemetry::snapshot::{GpuPanel, Snapshot};
use crate::telemetry::verdict::Verdict;
use crate::telemetry::warnings::Severity;
use anyhow::{bail, Result};

/// The exit status of a run stopped by a gate.
pub const EXIT_CODE: u8 = 3;

const FORMS: &str = "use METRIC<N or METRIC>N (tok/s, gpu_idle, loss, tau, dropped), \
verdict=NAME, or warn>=info|warn|error, each optionally with `after 60s` and `for 30s`; e.g. \
`tok/s<12000 after 60s`, `verdict=stalled for 30s`, `gpu_idle>20% after 60s`, `warn>=error`";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Metric {
    TokPerS,
    GpuIdle,
    Loss,
    Tau,
    Dropped,
}

impl Metric {
    const ALL: [(&'static str, Metric); 5] = [
        ("tok/s", Metric::TokPerS),
        ("gpu_idle", Metric::GpuIdle),
        ("loss", Metric::Loss),
        ("tau", Metric::Tau),
        ("dropped", Metric::Dropped),
    ];

    /// The value now; None when the run has no such number.
    fn read(self, s: &Snapshot) -> Option<f64> {
        match self {
            Metric::TokPerS => Some(s.train.tok_per_s_10s),
            Metric::Loss => s.train.loss.map(f64::from),
            Metric::Tau => s.train.tau.map(f64::from),
            Metric::Dropped => Some(s.self_cost.dropped as f64),
            // 100 - the mean utilisation of the GPUs this process uses.
            Metric::GpuIdle => {
                let GpuPanel::Present(gpus) = &s.gpus else {
                    return None;
                };
                let ours: Vec<f64> = gpus
                    .iter()
                    .filter(|g| g.cuda.is_some())
                    .map(|g| g.util_pct as f64)
                    .collect();
                if ours.is_empty() {
                    return None;
                }
                Some(100.0 - ours.iter().sum::<f64>() / ours.len() as f64)
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Ge => a >= b,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Cond {
    Metric(Metric, Op, f64),
    Verdict { name: String, equal: bool },
    Warn(Severity),
}

/// One gate.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub text: String,
    cond: Cond,
    after_s: f64,
    for_s: f64,
    /// When the condition began holding without a break (elapsed s).
    since: Option<f64>,
}

fn seconds(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.trim().parse().ok()?;
    (v >= 0.0 && v.is_finite()).then_some(v * scale)
}

fn number(s: &str) -> Option<f64> {
    let s = s.trim().trim_end_matches('%');
    let (num, scale) = match s.strip_suffix(['k', 'K']) {
        Some(n) => (n, 1e3),
        None => match s.strip_suffix('M') {
            Some(n) => (n, 1e6),
            None => (s, 1.0),
        },
    };
    let v: f64 = num.trim().parse().ok()?;
    v.is_finite().then_some(v * scale)
}

fn verdict_known(name: &str) -> bool {
    matches!(
        name,
        "starved"
            | "blocked"
            | "warmup"
            | "balanced"
            | "loader-bound"
            | "target-bound"
            | "drafter-bound"
            | "paused"
            | "stalled"
    ) || name.ends_with("-bound")
}

/// Whether `v`, in the words of `names`, is the verdict called `name`.
fn verdict_is(v: Verdict, names: &Names, name: &str) -> bool {
    match name {
        "starved" => matches!(
            v,
            Verdict::LoaderBound | Verdict::TargetBound | Verdict::Starved(_)
        ),
        "blocked" => matches!(v, Verdict::DrafterBound | Verdict::Blocked(_)),
        _ => names.verdict_short(v) == name,
    }
}

impl Gate {
    pub fn parse(text: &str) -> Result<Gate> {
        let bad = |why: &str| anyhow::anyhow!("--fail-if `{text}`: {why}; {FORMS}");
        // Clauses at the end: `after D`, `for D`, in either order.
        let mut words: Vec<&str> = text.split_whitespace().collect();
        let (mut after_s, mut for_s) = (0.0, 0.0);
        while words.len() >= 2 {
            let (k, v) = (words[words.len() - 2], words[words.len() - 1]);
            let slot = match k {
                "after" => &mut after_s,
                "for" => &mut for_s,
                _ => break,
            };
            *slot = seconds(v).ok_or_else(|| bad(&format!("`{v}` is not a duration")))?;
            words.truncate(words.len() - 2);
        }
        let cond_text: String = words.concat();
        if cond_text.is_empty() {
            return Err(bad("no condition"));
        }
        let cond = if let Some(rest) = cond_text.strip_prefix("verdict") {
            let (equal, name) = match (rest.strip_prefix("!="), rest.strip_prefix('=')) {
                (Some(n), _) => (false, n),
                (None, Some(n)) => (true, n),
                _ => return Err(bad("a verdict is compared with = or !=")),
            };
            if !verdict_known(name) {
                return Err(bad(&format!(
                    "`{name}` is not a verdict (starved, blocked, stalled, balanced, \
                     loader-bound, target-bound, drafter-bound, paused, warmup)"
                )));
            }
            Cond::Verdict {
                name: name.to_string(),
                equal,
            }
        } else if let Some(rest) = cond_text.strip_prefix("warn") {
            let level = rest
                .strip_prefix(">=")
                .ok_or_else(|| bad("warnings are compared with >="))?;
            Cond::Warn(
                Severity::parse(level)
                    .ok_or_else(|| bad(&format!("`{level}` is not info, warn or error")))?,
            )
        } else {
            let (name, metric) = Metric::ALL
                .into_iter()
                .find(|(n, _)| cond_text.starts_with(n))
                .ok_or_else(|| bad("no known metric or verdict= or warn>="))?;
            let rest = &cond_text[name.len()..];
            let (op, value) = [("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)]
                .into_iter()
                .find_map(|(s, op)| rest.strip_prefix(s).map(|v| (op, v)))
                .ok_or_else(|| bad(&format!("{name} is compared with <, <=, > or >=")))?;
            let v = number(value).ok_or_else(|| bad(&format!("`{value}` is not a number")))?;
            Cond::Metric(metric, op, v)
        };
        Ok(Gate {
            text: text.trim().to_string(),
            cond,
            after_s,
            for_s,
            since: None,
        })
    }

    /// Parses every `--fail-if`.
    pub fn parse_all(texts: &[String]) -> Result<Vec<Gate>> {
        texts.iter().map(|t| Gate::parse(t)).collect()
    }

    /// What the condition reads now, when it holds.
    fn holds(&self, s: &Snapshot) -> Option<String> {
        match &self.cond {
            Cond::Metric(m, op, v) => {
                let now = m.read(s)?;
                let name = Metric::ALL.iter().find(|(_, x)| x == m).map(|p| p.0)?;
                op.holds(now, *v).then(|| format!("{name}={now:.4}"))
            }
            Cond::Verdict { name, equal } => {
                let short = s.names.verdict_short(s.verdict);
                (verdict_is(s.verdict, &s.names, name) == *equal).then(|| match &s.stall {
                    Some(what) if s.verdict == Verdict::Stalled => {
                        format!("verdict={short} ({what})")
                    }
                    _ => format!("verdict={short}"),
                })
            }
            Cond::Warn(level) => {
                let hit: Vec<String> = s
                    .warnings
                    .iter()
                    .filter(|w| w.severity >= *level)
                    .map(|w| format!("{} ({})", w.key(), w.evidence))
                    .collect();
                (!hit.is_empty()).then(|| format!("warnings: {}", hit.join("; ")))
            }
        }
    }

    /// The reason, once the gate trips at `s`.
    pub fn check(&mut self, s: &Snapshot) -> Option<String> {
        let now = s.elapsed_s;
        if now < self.after_s {
            self.since = None;
            return None;
        }
        let Some(what) = self.holds(s) else {
            self.since = None;
            return None;
        };
        let since = *self.since.get_or_insert(now);
        (now - since >= self.for_s).then(|| {
            format!(
                "fail-if: `{}` held at t={now:.1}s: {what}; stopping with status {EXIT_CODE}",
                self.text
            )
        })
    }
}

/// The first gate that trips at `s`.
pub fn first_tripped(gates: &mut [Gate], s: &Snapshot) -> Option<String> {
    gates.iter_mut().find_map(|g| g.check(s))
}

/// `--fail-if` is a headless gate: refused with the TUI.
pub fn headless_only(gates: &[String], headless: bool) -> Result<()> {
    if !gates.is_empty() && !headless {
        bail!("--fail-if gates a headless run: add --headless (the TUI has a person watching)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
