//! Chrome trace (opens in Perfetto and chrome://tracing) from step spans: one track per thread,
//! one slice per phase. A step's phases are laid out in the order its role marks them, ending at
//! the step's end — the order the workers mark them in.

use super::snapshot::StepSpan;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
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
            t = t.saturating_add(*ns);
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// The trace of `chrome_trace`, written one event at a time: memory stays that of the spans,
/// not of a JSON tree many times their size.
fn write_events(w: &mut impl Write, spans: &[StepSpan]) -> std::io::Result<()> {
    let mut tids: BTreeMap<&str, usize> = BTreeMap::new();
    for s in spans {
        let n = tids.len();
        tids.entry(s.thread.as_str()).or_insert(n + 1);
    }
    w.write_all(b"{\"traceEvents\":[")?;
    let mut first = true;
    let mut event = |w: &mut dyn Write, v: Value| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut *w, &v).map_err(std::io::Error::other)
    };
    for (name, tid) in &tids {
        event(
            w,
            json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}),
        )?;
    }
    for s in spans {
        let tid = tids[s.thread.as_str()];
        let mut t = s.end_ns.saturating_sub(s.wall_ns);
        for (phase, ns) in &s.phases {
            event(
                w,
                json!({
                    "name": phase.name(),
                    "cat": s.role.name(),
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "ts": t as f64 / 1e3,
                    "dur": *ns as f64 / 1e3,
                }),
            )?;
            t = t.saturating_add(*ns);
        }
    }
    w.write_all(b"],\"displayTimeUnit\":\"ms\"}")?;
    w.flush()
}

/// Writes the trace atomically (temporary file + rename).
pub fn write_trace(path: &Path, spans: &[StepSpan]) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        write_events(&mut w, spans)?;
        w.into_inner().map(drop).map_err(|e| e.into_error())
    });
    written.with_context(|| format!("cannot write {}: check the directory", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The spans that ended in the last `seconds` of `spans`.
pub fn last_seconds(spans: &[StepSpan], seconds: f64) -> Vec<StepSpan> {
    let end = spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
    let from = end.saturating_sub((seconds * 1e9) as u64);
    spans.iter().filter(|s| s.end_ns >= from).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Phase, Role};

    #[test]
    fn the_streamed_trace_is_the_trace() {
        let spans = vec![
            StepSpan {
                thread: "drafter-0".into(),
                role: Role::Drafter,
                end_ns: 5_000,
                wall_ns: 3_000,
                phases: vec![(Phase::Forward, 1_000), (Phase::Backward, u64::MAX)],
            },
            StepSpan {
                thread: "target-0".into(),
                role: Role::Target,
                end_ns: 9_000,
                wall_ns: 1_000,
                phases: vec![(Phase::Forward, 1_000)],
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        write_trace(&path, &spans).unwrap();
        let read: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(read, chrome_trace(&spans));
        assert_eq!(read["traceEvents"].as_array().unwrap().len(), 2 + 3);
    }
}
