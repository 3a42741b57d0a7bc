//! `dflash-top attach`: list the running sessions, or join one in the TUI (same keys; the
//! control keys reach the watched process) or headless (the interval lines of `train
//! --headless`). Leaving detaches: the watched run goes on.

use crate::config::cli::AttachArgs;
use crate::headless::{follow, Follow};
use crate::telemetry::flight::FlightRecorder;
use crate::telemetry::snapshot_lines::SnapshotRecorder;
use crate::telemetry::warnings::WarnConfig;
use crate::telemetry::Telemetry;
use crate::wire::join::{list_text, local_hms, resolve_all, resolve_job, sessions, Attached};
use crate::wire::join_many::JoinedMany;
use crate::wire::serve::socket_dir;
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What the viewer watches: one session as it is, or several merged (their threads named by
/// rank).
enum Watched {
    One(Box<Attached>),
    Many(Box<JoinedMany>),
}

impl Watched {
    fn join(paths: &[PathBuf], merged: bool, warnings: WarnConfig, dwell_ns: u64) -> Result<Self> {
        match paths {
            [one] if !merged => Ok(Watched::One(Box::new(Attached::join_with(
                one, warnings, dwell_ns,
            )?))),
            many => Ok(Watched::Many(Box::new(JoinedMany::join(
                many, warnings, dwell_ns,
            )?))),
        }
    }

    fn telemetry(&self) -> &Telemetry {
        match self {
            Watched::One(s) => &s.telemetry,
            Watched::Many(m) => &m.telemetry,
        }
    }

    fn can_save(&self) -> bool {
        match self {
            Watched::One(s) => s.hello.can_save,
            Watched::Many(m) => m.can_save(),
        }
    }

    fn ended(&self) -> bool {
        match self {
            Watched::One(s) => s.ended.load(Ordering::SeqCst),
            Watched::Many(m) => m.ended.load(Ordering::SeqCst),
        }
    }

    fn end_reason(&self) -> Option<String> {
        match self {
            Watched::One(s) => s.end_reason(),
            Watched::Many(m) => m.end_reason(),
        }
    }

    /// `PID 1234 (dflash-top, /run/…/1234.sock)` (`PID 1234 on gpu-node-2 (…)` for another
    /// host's), or `2 sessions (r0 PID 1234, r1 PID 1235)`.
    fn who(&self, paths: &[PathBuf]) -> String {
        match self {
            Watched::One(s) => format!(
                "PID {}{} ({}, {})",
                s.hello.pid,
                s.on_host(),
                s.hello.program,
                paths[0].display()
            ),
            Watched::Many(m) => format!("{} sessions ({})", m.sessions.len(), m.who()),
        }
    }

    /// The header's line: `attached to PID 1234 (python)`, `attached to job ID (r0 PID …)`.
    fn label(&self) -> String {
        match self {
            Watched::One(s) => format!(
                "attached to PID {}{} ({})",
                s.hello.pid,
                s.on_host(),
                s.hello.program
            ),
            Watched::Many(m) => match m.sessions[0].hello.job.as_ref() {
                Some(j)
                    if m.sessions
                        .iter()
                        .all(|s| s.hello.job.as_ref().map(|k| &k.id) == Some(&j.id)) =>
                {
                    format!("attached to job {} ({})", j.id, m.who())
                }
                _ => format!("attached to {}", m.who()),
            },
        }
    }

    fn detach(self) {
        match self {
            Watched::One(s) => (*s).detach(),
            Watched::Many(m) => m.detach(),
        }
    }
}

/// The sockets the arguments name: `--job [ID]`'s ranks, or the targets.
fn sockets(args: &AttachArgs) -> Result<Vec<PathBuf>> {
    match &args.job {
        Some(_) if !args.targets.is_empty() => bail!(
            "--job and sockets together: give `--job [ID]` to join a job's local ranks, or the \
             sockets to join (`dflash-top attach A.sock B.sock`), not both"
        ),
        Some(id) => resolve_job(Some(id.as_str()).filter(|i| !i.is_empty())),
        None => resolve_all(&args.targets),
    }
}

pub fn run(args: &AttachArgs) -> Result<ExitCode> {
    if args.list {
        list_sessions();
        return Ok(ExitCode::SUCCESS);
    }
    check_args(args)?;
    let mut gates = crate::fail_if::Gate::parse_all(&args.fail_if)?;
    let (warnings, dwell_ns) = viewer_settings(args)?;
    let paths = sockets(args)?;
    let session = Watched::join(&paths, args.job.is_some(), warnings, dwell_ns)?;
    let who = session.who(&paths);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let label = format!("{} since {}", session.label(), local_hms(since));
    let flight = args
        .flight
        .as_deref()
        .map(|dir| FlightRecorder::start(session.telemetry(), dir))
        .transpose()?;
    let recorder = args
        .record
        .as_deref()
        .map(|p| {
            SnapshotRecorder::start(
                session.telemetry(),
                p,
                Duration::from_secs_f64(args.interval),
            )
        })
        .transpose()?;
    let deadline = args
        .seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut tripped = None;
    let result = if args.headless {
        // Before the run's lines, not a result: a reader already gone stops the following.
        crate::signals::print_line(&format!("attached to {who}"));
        let how = Follow {
            interval: Duration::from_secs_f64(args.interval),
            deadline,
            ended: &|| session.ended(),
            flight: flight.as_ref(),
            job: None,
        };
        tripped = follow(&session.telemetry().subscribe(), &mut gates, &how).tripped;
        Ok(())
    } else {
        tui(&session, deadline, label)
    };
    let reason = session.end_reason();
    if let Some(f) = flight {
        f.stop();
    }
    let recorded = recorder.map(SnapshotRecorder::finish).transpose();
    session.detach();
    result?;
    if let (Some(n), Some(p)) = (recorded?, &args.record) {
        eprintln!(
            "recorded {n} snapshots to {} (dflash-top replay {})",
            p.display(),
            p.display()
        );
    }
    Ok(detached(&who, paths.len(), tripped.is_some(), reason))
}

/// `--list`: the running sessions, or that there are none.
fn list_sessions() {
    let found = sessions();
    if found.is_empty() {
        crate::signals::outln!("no running session in {}", socket_dir().display());
    } else {
        crate::signals::outln!("{}", list_text(&found));
    }
}

fn check_args(args: &AttachArgs) -> Result<()> {
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        bail!("--interval must be a positive number of seconds");
    }
    if let Some(s) = args.seconds.filter(|s| !(*s > 0.0 && s.is_finite())) {
        bail!("--seconds must be a positive number of seconds, not {s}");
    }
    crate::fail_if::headless_only(&args.fail_if, args.headless)
}

/// The viewer's own settings from --config: its warning rules and its verdict dwell.
fn viewer_settings(args: &AttachArgs) -> Result<(WarnConfig, u64)> {
    Ok(match &args.config {
        Some(p) => {
            let file = crate::config::FileConfig::read(p)?;
            let dwell = crate::config::dwell_ns(file.verdict_dwell)
                .map_err(|e| anyhow::anyhow!("--config {}: {e}", p.display()))?;
            (file.warnings.unwrap_or_default(), dwell)
        }
        None => (Default::default(), crate::telemetry::verdict::DWELL_NS),
    })
}

/// The last line after detaching from `who` (`runs` watched runs), and the exit code: a held
/// --fail-if gate's, else the signal's.
fn detached(who: &str, runs: usize, tripped: bool, reason: Option<String>) -> ExitCode {
    // One watched run goes on; several (a job's ranks) go on.
    let (run, goes) = match runs {
        1 => ("the run goes on", "it goes on"),
        _ => ("the runs go on", "they go on"),
    };
    if tripped {
        eprintln!("detached from {who}: a --fail-if gate held; {run}");
        return ExitCode::from(crate::fail_if::EXIT_CODE);
    }
    match reason {
        Some(why) => eprintln!("detached from {who}: {why}"),
        None => eprintln!("detached from {who}; {goes}"),
    }
    crate::cmd::session::signal_exit()
}

fn tui(session: &Watched, deadline: Option<Instant>, label: String) -> Result<()> {
    use crate::tui::{terminal, EngineControls};
    terminal::install_panic_hook();
    let snapshots = session.telemetry().subscribe();
    let mut ctl = EngineControls::new(session.telemetry(), session.can_save());
    ctl.attached = true;
    ctl.attached_label = Some(label);
    let finished = || {
        if session.ended() {
            let why = session.end_reason().unwrap_or_default();
            return crate::tui::End::run(format!("{why}: press q to leave"));
        }
        // Only this viewer's time is up: the run goes on.
        deadline
            .filter(|d| Instant::now() >= *d)
            .map(|_| crate::tui::End {
                note: "time is up: press q to detach".to_string(),
                run_ended: false,
            })
    };
    // What trains, from the watched run's config line (a Python pipeline's hello has none).
    let config = match session {
        Watched::One(s) => s.hello.config.as_deref(),
        Watched::Many(m) => m.sessions.first().and_then(|s| s.hello.config.as_deref()),
    };
    let info = crate::summary::RunInfo {
        model: config.and_then(crate::engine::spec::model_label),
        ..Default::default()
    };
    crate::cmd::session::run_front_end(&ctl, &snapshots, &finished, info).map(|_| ())
}
