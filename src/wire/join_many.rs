//! Several joined sessions as one view (`attach --job`, `attach A B`): each session runs its own
//! local hub (src/wire/join.rs: its process's per-thread CPU, its own verdict), and a merge thread
//! publishes what src/wire/merge.rs makes of their latest snapshots ten times a second on one
//! `Telemetry` the front-ends subscribe to. Commands sent to it (pause, profiling, checkpoint) go
//! to every session. A session that ends is named and the view goes on with the others; it ends
//! when all have.

use super::join::Attached;
use super::merge::{merge, Part};
use crate::cancel::CancelToken;
use crate::telemetry::warnings::WarnConfig;
use crate::telemetry::{HubCommand, Snapshot, Telemetry};
use anyhow::Result;
use crossbeam_channel::Receiver;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the merged view publishes (the hubs' own pace).
const MERGE_EVERY: Duration = Duration::from_millis(100);

/// The sessions, merged.
pub struct JoinedMany {
    /// What the front-ends subscribe to and send their commands to (no hub of its own).
    pub telemetry: Telemetry,
    /// Each session's name in the view (`r1`, `p1234`), in the view's order.
    pub labels: Vec<String>,
    pub sessions: Vec<Attached>,
    /// Set once every session's stream ended.
    pub ended: Arc<AtomicBool>,
    end_reason: Arc<Mutex<Option<String>>>,
    stop: CancelToken,
    merger: Option<JoinHandle<()>>,
}

/// What the merge thread reads of one session.
struct Feed {
    label: String,
    snapshots: Receiver<Arc<Snapshot>>,
    latest: Option<Arc<Snapshot>>,
    ended: Arc<AtomicBool>,
    reason: Arc<Mutex<Option<String>>>,
    said_ended: bool,
    telemetry: Telemetry,
    last_status: Option<String>,
}

/// `r1` for a rank of a job, else `p<PID>`; a name two sessions would share becomes `p<PID>`.
pub fn labels(sessions: &[Attached]) -> Vec<String> {
    let own: Vec<String> = sessions
        .iter()
        .map(|s| match &s.hello.job {
            Some(j) => j.prefix(),
            None => format!("p{}", s.hello.pid),
        })
        .collect();
    own.iter()
        .zip(sessions)
        .map(|(l, s)| {
            if own.iter().filter(|o| *o == l).count() > 1 {
                format!("p{}", s.hello.pid)
            } else {
                l.clone()
            }
        })
        .collect()
}

/// The merged view names phases through one `Names`. Our trainers' threads keep the built-in
/// names whatever a pipeline declares, so trainers merge with each other and with one declared
/// pipeline (a Python pipeline beside a trainer); sessions of two different declared pipelines
/// are refused with a sentence naming them.
fn one_declared_pipeline(sessions: &[Attached]) -> Result<()> {
    let describe = |s: &Attached| {
        let names: Vec<&str> = s
            .hello
            .stages
            .stages
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        match names.is_empty() {
            true => format!("PID {}: its stages not declared yet", s.hello.pid),
            false => format!("PID {}: {}", s.hello.pid, names.join(" → ")),
        }
    };
    let declared: Vec<&Attached> = sessions
        .iter()
        .filter(|s| !s.hello.stages.is_builtin())
        .collect();
    let Some(first) = declared.first() else {
        return Ok(());
    };
    if let Some(other) = declared
        .iter()
        .find(|s| s.hello.stages != first.hello.stages)
    {
        anyhow::bail!(
            "these sessions run different pipelines ({}; {}): one view shows dflash-top trainers \
             with at most one other pipeline; attach them one at a time",
            describe(first),
            describe(other)
        );
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl JoinedMany {
    /// Joins every socket of `paths` (one that cannot be joined is an error naming it; those
    /// joined already are left), ranks of a job in rank order.
    pub fn join(paths: &[PathBuf], warnings: WarnConfig, dwell_ns: u64) -> Result<JoinedMany> {
        let mut sessions: Vec<Attached> = Vec::new();
        for p in paths {
            match Attached::join_with(p, warnings.clone(), dwell_ns) {
                Ok(s) => sessions.push(s),
                Err(e) => {
                    sessions.into_iter().for_each(Attached::detach);
                    return Err(e);
                }
            }
        }
        if let Err(e) = one_declared_pipeline(&sessions) {
            sessions.into_iter().for_each(Attached::detach);
            return Err(e);
        }
        sessions.sort_by_key(|s| s.hello.job.as_ref().map_or(u32::MAX, |j| j.rank));
        let labels = labels(&sessions);
        let mut telemetry = Telemetry::new();
        telemetry.probes = false;
        // The declared pipeline's names, if one is among them (ours hold for our threads).
        let named = sessions
            .iter()
            .find(|s| !s.hello.stages.is_builtin())
            .or(sessions.first());
        if let Some(s) = named {
            telemetry.set_names(s.telemetry.names());
        }
        let feeds: Vec<Feed> = sessions
            .iter()
            .zip(&labels)
            .map(|(s, label)| Feed {
                label: label.clone(),
                snapshots: s.telemetry.subscribe(),
                latest: None,
                ended: s.ended.clone(),
                reason: s.end_reason.clone(),
                said_ended: false,
                telemetry: s.telemetry.clone(),
                last_status: None,
            })
            .collect();
        let ended = Arc::new(AtomicBool::new(false));
        let end_reason = Arc::new(Mutex::new(None));
        let stop = CancelToken::new();
        let merger = {
            let (view, ended, end_reason, stop) = (
                telemetry.clone(),
                ended.clone(),
                end_reason.clone(),
                stop.clone(),
            );
            std::thread::Builder::new()
                .name("attach-merge".into())
                .spawn(move || merge_loop(feeds, &view, &ended, &end_reason, &stop))?
        };
        Ok(JoinedMany {
            telemetry,
            labels,
            sessions,
            ended,
            end_reason,
            stop,
            merger: Some(merger),
        })
    }

    /// Whether any session can save a checkpoint.
    pub fn can_save(&self) -> bool {
        self.sessions.iter().any(|s| s.hello.can_save)
    }

    /// Why the view ended, once every session has.
    pub fn end_reason(&self) -> Option<String> {
        lock(&self.end_reason).clone()
    }

    /// `r0 PID 1234, r1 PID 1235`.
    pub fn who(&self) -> String {
        self.labels
            .iter()
            .zip(&self.sessions)
            .map(|(l, s)| format!("{l} PID {}{}", s.hello.pid, s.on_host()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Leaves every session (their runs go on) and joins every thread.
    pub fn detach(mut self) {
        self.stop.cancel();
        if let Some(h) = self.merger.take() {
            let _ = h.join();
        }
        self.sessions.into_iter().for_each(Attached::detach);
    }
}

/// Every `MERGE_EVERY`: the view's commands to every session, each session's newest snapshot
/// taken, a session that ended named, the merge published.
fn merge_loop(
    mut feeds: Vec<Feed>,
    view: &Telemetry,
    ended: &AtomicBool,
    end_reason: &Mutex<Option<String>>,
    stop: &CancelToken,
) {
    let mut seq = 0u64;
    let mut notes: Vec<String> = Vec::new();
    let mut status: Option<String> = None;
    while !stop.is_cancelled() {
        std::thread::sleep(MERGE_EVERY);
        for c in view.take_commands() {
            if let Some(line) = forward(&feeds, c) {
                status = Some(line);
            }
        }
        // A session that ended keeps the last snapshot taken when it did.
        for f in feeds.iter_mut().filter(|f| !f.said_ended) {
            if let Some(s) = newest_with_all_steps(f) {
                if s.status.is_some() && s.status != f.last_status {
                    status = s.status.as_ref().map(|t| format!("{}: {t}", f.label));
                }
                f.last_status = s.status.clone();
                f.latest = Some(s);
            }
            if !f.said_ended && f.ended.load(Ordering::SeqCst) {
                f.said_ended = true;
                let why = lock(&f.reason).clone().unwrap_or_default();
                notes.push(format!("{} ended ({why})", f.label));
            }
        }
        let parts: Vec<Part> = feeds
            .iter()
            .filter_map(|f| {
                Some(Part {
                    label: &f.label,
                    snap: f.latest.as_deref()?,
                    ended: f.said_ended,
                })
            })
            .collect();
        if parts.is_empty() {
            continue;
        }
        seq += 1;
        let mut snap = merge(&parts, seq);
        snap.status = status.clone();
        snap.alerts.extend(notes.iter().cloned());
        snap.alerts.extend(view.alerts());
        follow_switches(view, &snap);
        view.publish(snap);
        if feeds.iter().all(|f| f.said_ended) && !ended.load(Ordering::SeqCst) {
            *lock(end_reason) = Some(format!("every session ended: {}", notes.join("; ")));
            ended.store(true, Ordering::SeqCst);
        }
    }
}

/// The newest of a feed's snapshots since the last merge, holding the step spans of all of them
/// (a merge reads ten times a second, a session's hub may publish faster, and a recording of
/// the merged view keeps its spans); with no new snapshot, the last one without its spans,
/// which the merge before already passed on. None before the first.
fn newest_with_all_steps(f: &Feed) -> Option<Arc<Snapshot>> {
    let mut steps = Vec::new();
    let mut newest = None;
    for s in f.snapshots.try_iter() {
        steps.extend(s.steps.iter().cloned());
        newest = Some(s);
    }
    match newest {
        Some(s) if s.steps.len() == steps.len() => Some(s),
        Some(s) => Some(Arc::new(Snapshot {
            steps,
            ..(*s).clone()
        })),
        None => {
            let last = f.latest.as_ref()?;
            (!last.steps.is_empty()).then(|| {
                Arc::new(Snapshot {
                    steps: Vec::new(),
                    ..(**last).clone()
                })
            })
        }
    }
}

/// A command of the view's: the engine's to every session still running (each forwards it to
/// its process), a window reset to every hub; a status line (a flight dump written) stays here
/// and is returned.
fn forward(feeds: &[Feed], c: HubCommand) -> Option<String> {
    match c {
        HubCommand::Status(line) => Some(line),
        c => {
            feeds
                .iter()
                .filter(|f| !f.said_ended)
                .for_each(|f| f.telemetry.command(c.clone()));
            None
        }
    }
}

/// The view's switches and names as the merged snapshot reports them (what the TUI's badges
/// read).
fn follow_switches(view: &Telemetry, snap: &Snapshot) {
    view.set_names(snap.names.clone());
    let sw = view.switches();
    sw.set_profiling(snap.profiling);
    sw.set_paused(snap.paused);
    if let Some(t) = snap.gpu_timing {
        sw.set_gpu_timing(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::snapshot::StepSpan;
    use crate::telemetry::Role;

    /// A merge that finds several snapshots of a session keeps the step spans of all of them
    /// (a recording of the merged view would lose steps otherwise), and passes each on once.
    #[test]
    fn a_merge_keeps_every_snapshots_steps_once() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut f = Feed {
            label: "r0".into(),
            snapshots: rx,
            latest: None,
            ended: Arc::default(),
            reason: Arc::default(),
            said_ended: false,
            telemetry: Telemetry::new(),
            last_status: None,
        };
        let with_step = |end_ns: u64| {
            Arc::new(Snapshot {
                seq: end_ns,
                steps: vec![StepSpan {
                    thread: "drafter-0".into(),
                    role: Role::Drafter,
                    end_ns,
                    wall_ns: 1,
                    phases: Vec::new(),
                }],
                ..Snapshot::default()
            })
        };
        assert!(newest_with_all_steps(&f).is_none());
        for k in 1..=3 {
            tx.send(with_step(k)).unwrap();
        }
        let s = newest_with_all_steps(&f).unwrap();
        let ends: Vec<u64> = s.steps.iter().map(|st| st.end_ns).collect();
        assert_eq!((s.seq, ends), (3, vec![1, 2, 3]));
        f.latest = Some(s);
        // Nothing new: the same snapshot without the spans already passed on, then nothing.
        let again = newest_with_all_steps(&f).unwrap();
        assert_eq!((again.seq, again.steps.len()), (3, 0));
        f.latest = Some(again);
        assert!(newest_with_all_steps(&f).is_none());
        tx.send(with_step(4)).unwrap();
        assert_eq!(newest_with_all_steps(&f).unwrap().steps[0].end_ns, 4);
    }
}
