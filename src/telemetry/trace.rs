//! Chrome trace (opens in Perfetto and chrome://tracing) from step spans: one track per thread,
//! one slice per phase. A step's phases are laid out in the order its role marks them, ending at
//! the step's end — the order the workers mark them in. Phases and roles are named by the names
//! of the pipeline the spans come from.

use super::names::Names;
use super::snapshot::StepSpan;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// The trace's events: a name for each thread's track, then a slice per phase of each step.
fn events<'a>(spans: &'a [StepSpan], names: &'a Names) -> impl Iterator<Item = Value> + 'a {
    let mut tids: BTreeMap<&str, usize> = BTreeMap::new();
    for s in spans {
        let n = tids.len();
        tids.entry(s.thread.as_str()).or_insert(n + 1);
    }
    let tracks: Vec<Value> = tids
        .iter()
        .map(|(name, tid)| json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": name}}))
        .collect();
    let slices = spans.iter().flat_map(move |s| {
        let tid = tids[s.thread.as_str()];
        let mut t = s.end_ns.saturating_sub(s.wall_ns);
        s.phases.iter().map(move |(phase, ns)| {
            let at = t;
            t = t.saturating_add(*ns);
            json!({
                "name": names.phase(*phase),
                "cat": names.role(s.role),
                "ph": "X",
                "pid": 1,
                "tid": tid,
                "ts": at as f64 / 1e3,
                "dur": *ns as f64 / 1e3,
            })
        })
    });
    tracks.into_iter().chain(slices)
}

/// The trace written one event at a time: memory stays that of the spans, not of a JSON tree
/// many times their size.
fn write_events(w: &mut impl Write, spans: &[StepSpan], names: &Names) -> std::io::Result<()> {
    w.write_all(b"{\"traceEvents\":[")?;
    for (i, v) in events(spans, names).enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut *w, &v).map_err(std::io::Error::other)?;
    }
    w.write_all(b"],\"displayTimeUnit\":\"ms\"}")?;
    w.flush()
}

/// Writes the trace atomically (temporary file + rename), phases named by `names`.
pub fn write_trace(path: &Path, spans: &[StepSpan], names: &Names) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        write_events(&mut w, spans, names)?;
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

/// What a trace holds, in words: every thread's steps are spans, so a 300-step run of a
/// loader, a target and a drafter holds ~900 spans. `300 drafter steps, 909 step spans of 3
/// threads`; without drafters (a client's own stages), the spans and threads alone.
pub fn describe(spans: &[StepSpan]) -> String {
    let threads: std::collections::BTreeSet<&str> =
        spans.iter().map(|s| s.thread.as_str()).collect();
    let drafters: Vec<&StepSpan> = spans
        .iter()
        .filter(|s| s.role == super::Role::Drafter)
        .collect();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let of = format!(
        "{} step span{} of {} thread{}",
        spans.len(),
        plural(spans.len()),
        threads.len(),
        plural(threads.len())
    );
    if drafters.is_empty() {
        return of;
    }
    format!("{} drafter steps, {of}", drafters.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Phase, Role};

    #[test]
    fn a_trace_counts_drafter_steps_apart_from_every_thread_s_spans() {
        let span = |thread: &str, role: Role| StepSpan {
            thread: thread.into(),
            role,
            end_ns: 1,
            wall_ns: 1,
            phases: vec![],
        };
        let mut spans = Vec::new();
        for _ in 0..300 {
            spans.push(span("loader", Role::Loader));
            spans.push(span("target-0", Role::Target));
            spans.push(span("drafter-0", Role::Drafter));
        }
        spans.extend((0..9).map(|_| span("loader", Role::Loader)));
        assert_eq!(
            describe(&spans),
            "300 drafter steps, 909 step spans of 3 threads"
        );
        let stage = vec![span("decode", Role::Stage(1))];
        assert_eq!(describe(&stage), "1 step span of 1 thread");
    }

    #[test]
    fn the_trace_names_tracks_and_lays_phases_end_to_end() {
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
        write_trace(&path, &spans, &Names::builtin()).unwrap();
        let read: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let ev = read["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 2 + 3);
        assert_eq!(read["displayTimeUnit"], "ms");
        // Two named tracks, then each step's phases laid end to end from its start.
        assert_eq!(ev[0]["args"]["name"], "drafter-0");
        assert_eq!(ev[1]["args"]["name"], "target-0");
        let slice = |i: usize| {
            let e = &ev[i];
            (
                e["name"].as_str().unwrap().to_string(),
                e["tid"].as_u64().unwrap(),
                e["ts"].as_f64().unwrap(),
            )
        };
        assert_eq!(slice(2), ("forward".into(), 1, 2.0));
        assert_eq!(slice(3), ("backward".into(), 1, 3.0));
        assert_eq!(slice(4), ("forward".into(), 2, 8.0));
    }
}
