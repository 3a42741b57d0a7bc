//! `dflash-top train` with its TUI in a torchrun-style job, where the ranks of a host share one
//! terminal: one screen a host. The process of LOCAL_RANK 0 draws every rank of the job on this
//! host, merged as `attach --job` merges them (threads `r1/drafter-0`, tok/s summed, the
//! slowest rank named); the other local ranks train without writing to the terminal (their
//! errors still go to stderr). `q` on that screen stops the job: this rank stops, and every
//! other one stops at the same step (saving as set).

use super::session::{run_front_end, signal_exit, Session};
use crate::cli::TrainArgs;
use crate::config::RunConfig;
use crate::job::JobTag;
use crate::summary::Summary;
use crate::wire::join_many::JoinedMany;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The store key under which each rank says where its socket is (`HOST\nPATH`).
const SOCKET_KEY: &str = "socket";

/// How long the screen waits for the other ranks to say where their sockets are (they say it
/// as their sessions start, right after the rendezvous).
const SOCKETS_WAIT: Duration = Duration::from_secs(60);

/// How long the screen waits, after this rank stopped, for the other local ranks to end.
const ENDS_WAIT: Duration = Duration::from_secs(10);

/// Says where this rank's socket is, for the screen on its host (every rank of a job, whatever
/// its front-end: an empty path when it serves none).
pub fn publish_socket(session: &Session, tag: &JobTag) -> Result<()> {
    let Some(link) = session.pipeline.link() else {
        return Ok(());
    };
    let path = session
        .server
        .as_ref()
        .map(|s| s.path.display().to_string())
        .unwrap_or_default();
    link.publish(SOCKET_KEY, format!("{}\n{path}", tag.host).as_bytes())
}

/// A rank that is not its host's screen: trains until the job ends or a signal, quietly.
pub fn quiet(args: &TrainArgs) -> Result<ExitCode> {
    let cfg = RunConfig::from_args(args)?;
    let session = Session::start(&cfg)?;
    while !crate::signals::requested() && !session.pipeline.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
    }
    session.finish()?;
    Ok(signal_exit())
}

/// The screen of this host's ranks (this process is LOCAL_RANK 0 of `tag`'s job).
pub fn screen(args: &TrainArgs, tag: &JobTag) -> Result<ExitCode> {
    use crate::tui::{terminal, EngineControls};
    let _hushed = terminal::hush_input();
    let cfg = RunConfig::from_args(args)?;
    terminal::install_panic_hook();
    crate::tui::config::load(&Default::default())?;
    let session = Session::start(&cfg)?;
    let viewer = &cfg.viewer;
    // Every local rank merged; failing that (no socket, --max-viewers 0), this rank alone.
    let joined = local_sockets(&session, tag).and_then(|paths| {
        JoinedMany::join(&paths, viewer.warnings.clone(), viewer.verdict_dwell_ns)
    });
    let (telemetry, label) = match &joined {
        Ok(j) => (
            j.telemetry.clone(),
            format!("job {} on this screen: {}", tag.id, j.who()),
        ),
        Err(e) => (
            session.telemetry.clone(),
            format!(
                "job {}: rank {} alone on this screen ({e:#})",
                tag.id, tag.rank
            ),
        ),
    };
    let snapshots = telemetry.subscribe();
    let mut ctl = EngineControls::new(&telemetry, cfg.pipeline.save_dir.is_some());
    ctl.attached_label = Some(label);
    let pipeline = &session.pipeline;
    let finished = || super::train::run_end(pipeline);
    let info = super::train::run_info(&cfg, pipeline.start_step);
    let shown = run_front_end(&ctl, &snapshots, &finished, info.clone());
    let finish = session.finish();
    // The job's last figures: the merged view of every local rank's final snapshot, once each
    // has ended (they stop at this rank's last step).
    if let Ok(j) = &joined {
        let waited = std::time::Instant::now();
        while !j.ended.load(std::sync::atomic::Ordering::SeqCst) && waited.elapsed() < ENDS_WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut last = shown?;
    while let Ok(s) = snapshots.try_recv() {
        last = Some(s);
    }
    if let Ok(j) = joined {
        j.detach();
    }
    finish?;
    // The job's summary on this host (the ranks' steps and tokens merged).
    if let Some(s) = last {
        println!("{}", Summary::of(&s, &info).line());
    }
    Ok(signal_exit())
}

/// The sockets of the job's ranks on this host, in rank order, as each rank published them.
fn local_sockets(session: &Session, tag: &JobTag) -> Result<Vec<PathBuf>> {
    let link = session
        .pipeline
        .link()
        .context("this process is in no job")?;
    let all = link.gather(SOCKET_KEY, &session.pipeline.cancel, SOCKETS_WAIT)?;
    let here: Vec<PathBuf> = all
        .iter()
        .filter_map(|said| {
            let text = String::from_utf8_lossy(said);
            let (host, path) = text.split_once('\n')?;
            (host == tag.host && !path.is_empty()).then(|| PathBuf::from(path))
        })
        .collect();
    anyhow::ensure!(!here.is_empty(), "no rank on this host serves a socket");
    Ok(here)
}
