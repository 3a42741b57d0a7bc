//! Chrome trace (opens in Perfetto and chrome://tracing) from step spans: one track per thread,
//! one slice per phase. A step's phases are laid out in the order its role marks them, ending at
//! the step's end — the order the workers mark them in.

use super::snapshot::StepSpan;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

pub fn chrome_trace(spans: &[StepSpan]) -> Value {
    let mut tids: BTreeMap<&str, usize> = BTreeMap::new();
    for s in spans {
        let n = tids.len();
        tids.entry(s.thread.as_str()).or_insert(n + 1);
    }
    let mut events: Vec<Value> = tids
        .iter()
        .map(|(name, tid)| json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}))
        .collect();
    for s in spans {
        let tid = tids[s.thread.as_str()];
        let mut t = s.end_ns.saturating_sub(s.wall_ns);
        for (phase, ns) in &s.phases {
            events.push(json!({
                "name": phase.name(),
                "cat": s.role.name(),
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": t as f64 / 1e3,
                "dur": *ns as f64 / 1e3,
            }));
            t += ns;
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// Writes the trace atomically (temporary file + rename).
pub fn write_trace(path: &Path, spans: &[StepSpan]) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&chrome_trace(spans))?)
        .with_context(|| format!("cannot write {}: check the directory", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The spans that ended in the last `seconds` of `spans`.
pub fn last_seconds(spans: &[StepSpan], seconds: f64) -> Vec<StepSpan> {
    let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    let from = end.saturating_sub((seconds * 1e9) as u64);
    spans.iter().filter(|s| s.end_ns >= from).cloned().collect()
}
