//! The flight recorder: the last minute of snapshots (with the steps that ended in them) always
//! kept in memory, bounded in bytes per thread-second; when something goes wrong — a warning of
//! severity error coming into force, the verdict turning stalled, a `--fail-if` gate — it is
//! written out as a recording `replay` and `export` open (one snapshot a JSON line) plus a Chrome
//! trace of its span, at most one dump a minute.
//!
//! A verdict that names a bottleneck (loader-, target- or drafter-bound, a declared stage starved
//! or blocked) or balanced is a healthy pipeline's state: every pipeline is bound by some stage,
//! and which one moves as a run warms up. The first verdict after warm-up and a turn among those
//! do not dump (a dump of a healthy run's first seconds would hold nothing, and would use up the
//! minute in which a real stall may come). A stage that starves for long is said by the
//! `starved` and `blocked` warnings: made errors (`[warnings.severity]`), they dump too.

use super::hub::{HubCommand, Telemetry};
use super::snapshot::{GpuPanel, Snapshot};
use super::verdict::Verdict;
use super::warning::Severity;
use crate::cancel::CancelToken;
use anyhow::{Context, Result};
use crossbeam_channel::RecvTimeoutError;
use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Seconds of snapshots kept.
pub const KEEP_S: f64 = 60.0;
/// Bytes kept per thread and second at most (a snapshot's JSON, histories left out): a burst of
/// steps keeps less than a minute rather than more memory.
pub const BYTES_PER_THREAD_SECOND: usize = 48 << 10;
/// Seconds between two dumps at least.
pub const DUMP_EVERY_S: f64 = 60.0;
/// Points kept in a rebuilt queue or GPU history.
const HISTORY: usize = 120;

/// The snapshots of the last `KEEP_S` seconds, bounded in bytes.
#[derive(Debug, Default)]
pub struct FlightRing {
    snaps: VecDeque<(Snapshot, usize)>,
    bytes: usize,
}

impl FlightRing {
    /// The byte bound for `threads` threads.
    pub fn budget(threads: usize) -> usize {
        BYTES_PER_THREAD_SECOND * threads.max(1) * KEEP_S as usize
    }

    /// Keeps `s` without its histories (rebuilt from the ring when dumped); drops what is older
    /// than `KEEP_S` or beyond the byte bound, oldest first.
    pub fn push(&mut self, s: &Snapshot) {
        let mut s = s.clone();
        s.loss_history = Vec::new();
        s.tok_history = Vec::new();
        for q in &mut s.queues {
            q.history = Vec::new();
        }
        if let GpuPanel::Present(gpus) = &mut s.gpus {
            for g in gpus {
                g.util_history = Vec::new();
            }
        }
        let size = serde_json::to_vec(&s).map(|v| v.len()).unwrap_or(0);
        let budget = Self::budget(s.threads.len());
        let now = s.elapsed_s;
        self.bytes += size;
        self.snaps.push_back((s, size));
        while let Some((old, n)) = self.snaps.front() {
            let too_old = now - old.elapsed_s > KEEP_S;
            if !(too_old || self.bytes > budget) || self.snaps.len() == 1 {
                break;
            }
            self.bytes -= n;
            self.snaps.pop_front();
        }
    }

    /// Bytes held (the snapshots' JSON).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.snaps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.snaps.is_empty()
    }

    /// Seconds from the oldest snapshot kept to the newest.
    pub fn span_s(&self) -> f64 {
        match (self.snaps.front(), self.snaps.back()) {
            (Some(a), Some(b)) => b.0.elapsed_s - a.0.elapsed_s,
            _ => 0.0,
        }
    }

    /// The snapshots kept, their charts and sparklines rebuilt from the ring itself.
    pub fn snapshots(&self) -> Vec<Snapshot> {
        let mut loss = Vec::new();
        let mut tok = Vec::new();
        let mut queues: Vec<VecDeque<f64>> = Vec::new();
        let mut gpus: Vec<VecDeque<u32>> = Vec::new();
        let mut out = Vec::with_capacity(self.snaps.len());
        for (s, _) in &self.snaps {
            let mut s = s.clone();
            if let Some(l) = s.train.loss {
                loss.push((s.elapsed_s, l as f64));
            }
            tok.push((s.elapsed_s, s.train.tok_per_s_1s));
            s.loss_history = loss.clone();
            s.tok_history = tok.clone();
            queues.resize_with(s.queues.len(), VecDeque::new);
            for (q, h) in s.queues.iter_mut().zip(&mut queues) {
                super::window::push_capped(h, q.mean_depth, HISTORY);
                q.history = h.iter().copied().collect();
            }
            if let GpuPanel::Present(list) = &mut s.gpus {
                gpus.resize_with(list.len(), VecDeque::new);
                for (g, h) in list.iter_mut().zip(&mut gpus) {
                    super::window::push_capped(h, g.util_pct, HISTORY);
                    g.util_history = h.iter().copied().collect();
                }
            }
            out.push(s);
        }
        out
    }
}

/// What makes a dump: a new error warning, or the verdict turning stalled.
#[derive(Debug, Default)]
pub struct Trigger {
    errors: HashSet<String>,
    verdict: Verdict,
}

impl Trigger {
    /// Why `s` calls for a dump, if it does.
    pub fn check(&mut self, s: &Snapshot) -> Option<String> {
        let errors: HashSet<String> = s
            .warnings
            .iter()
            .filter(|w| w.severity == Severity::Error)
            .map(|w| w.key())
            .collect();
        let new_error = s
            .warnings
            .iter()
            .find(|w| w.severity == Severity::Error && !self.errors.contains(&w.key()));
        let (before, now) = (self.verdict, s.verdict);
        // A bottleneck named, or moving, is no incident (the module's comment says why).
        let turned = now == Verdict::Stalled && before != Verdict::Stalled;
        let why = match new_error {
            Some(w) => Some(format!("{} ({})", w.key(), w.evidence)),
            None => turned.then(|| match &s.stall {
                Some(what) => format!("verdict stalled: {what}"),
                None => "verdict turned stalled".to_string(),
            }),
        };
        self.errors = errors;
        self.verdict = now;
        why
    }
}

/// A dump written.
#[derive(Clone, Debug, PartialEq)]
pub struct Dump {
    pub recording: PathBuf,
    /// None when the span held no profiled steps.
    pub trace: Option<PathBuf>,
    pub reason: String,
}

impl Dump {
    /// `flight: DIR/flight-…jsonl (trace DIR/flight-…trace.json): why` — the line headless
    /// prints; the TUI shows it on its status line.
    pub fn line(&self) -> String {
        let trace = self
            .trace
            .as_ref()
            .map(|t| format!(" (trace {})", t.display()))
            .unwrap_or_default();
        format!(
            "flight: {}{trace}: {}",
            self.recording.display(),
            self.reason
        )
    }
}

/// Writes the ring to `dir` as `flight-<unix s>-<seq>.jsonl` and its Chrome trace beside it.
pub fn write_dump(dir: &Path, ring: &FlightRing, reason: &str) -> Result<Dump> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("--flight {}: cannot create the directory", dir.display()))?;
    let snaps = ring.snapshots();
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let seq = snaps.last().map(|s| s.seq).unwrap_or(0);
    let stem = format!("flight-{unix}-{seq}");
    let recording = dir.join(format!("{stem}.jsonl"));
    let tmp = dir.join(format!("{stem}.jsonl.tmp"));
    let written = std::fs::File::create(&tmp).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        for s in &snaps {
            serde_json::to_writer(&mut w, s).map_err(std::io::Error::other)?;
            w.write_all(b"\n")?;
        }
        w.into_inner().map(drop).map_err(|e| e.into_error())
    });
    written.with_context(|| format!("--flight: cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &recording)
        .with_context(|| format!("--flight: cannot write {}", recording.display()))?;
    let spans: Vec<_> = snaps.iter().flat_map(|s| s.steps.iter().cloned()).collect();
    let trace = if spans.is_empty() {
        None
    } else {
        let path = dir.join(format!("{stem}.trace.json"));
        // The names of the pipeline as the newest snapshot has them.
        let names = snaps.last().map(|s| s.names.clone()).unwrap_or_default();
        super::trace::write_trace(&path, &spans, &names)?;
        Some(path)
    };
    Ok(Dump {
        recording,
        trace,
        reason: reason.to_string(),
    })
}

/// The ring, the trigger and the dumps, shared between the recorder's thread and its owner.
#[derive(Debug, Default)]
struct State {
    ring: FlightRing,
    trigger: Trigger,
    /// Elapsed time of the last dump's newest snapshot.
    last_dump_s: Option<f64>,
    /// Dumps written that the owner has not taken yet.
    new: Vec<Dump>,
}

impl State {
    /// Writes a dump unless one was written less than `DUMP_EVERY_S` ago.
    fn dump(&mut self, dir: &Path, reason: &str) -> Option<Result<Dump>> {
        let now = self.ring.snaps.back()?.0.elapsed_s;
        if self.last_dump_s.is_some_and(|t| now - t < DUMP_EVERY_S) {
            return None;
        }
        self.last_dump_s = Some(now);
        let d = write_dump(dir, &self.ring, reason);
        if let Ok(d) = &d {
            self.new.push(d.clone());
        }
        Some(d)
    }
}

/// The flight recorder of a run: a thread that follows the hub's snapshots.
pub struct FlightRecorder {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    stop: CancelToken,
    handle: Option<JoinHandle<()>>,
}

impl FlightRecorder {
    /// Follows `telemetry`'s snapshots; dumps go to `dir` (made when the first is written).
    pub fn start(telemetry: &Telemetry, dir: &Path) -> Result<FlightRecorder> {
        // A second and a half of snapshots of slack: the thread only copies them.
        let rx = telemetry.subscribe_with(64);
        let state = Arc::new(Mutex::new(State::default()));
        let stop = CancelToken::new();
        let handle = {
            let (state, stop, dir, t) = (
                state.clone(),
                stop.clone(),
                dir.to_path_buf(),
                telemetry.clone(),
            );
            std::thread::Builder::new()
                .name("flight".into())
                .spawn(move || {
                    while !stop.is_cancelled() {
                        let s = match rx.recv_timeout(Duration::from_millis(100)) {
                            Ok(s) => s,
                            Err(RecvTimeoutError::Timeout) => continue,
                            Err(RecvTimeoutError::Disconnected) => break,
                        };
                        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                        st.ring.push(&s);
                        let Some(why) = st.trigger.check(&s) else {
                            continue;
                        };
                        match st.dump(&dir, &why) {
                            Some(Ok(d)) => t.command(HubCommand::Status(d.line())),
                            Some(Err(e)) => t.alert(format!("{e:#}")),
                            None => {}
                        }
                    }
                })?
        };
        Ok(FlightRecorder {
            dir: dir.to_path_buf(),
            state,
            stop,
            handle: Some(handle),
        })
    }

    /// Dumps now (a `--fail-if` gate held), unless a dump was written less than a minute ago.
    pub fn dump_now(&self, reason: &str) -> Option<Result<Dump>> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.dump(&self.dir, reason)
    }

    /// The dumps written since the last call.
    pub fn take_new(&self) -> Vec<Dump> {
        std::mem::take(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()).new)
    }

    pub fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;
