//! `dflash-top train` with its TUI in a torchrun-style job, where the ranks of a host share one
//! terminal: one screen a host. The process of LOCAL_RANK 0 draws every rank of the job on this
//! host, merged as `attach --job` merges them (threads `r1/drafter-0`, tok/s summed, the
//! slowest rank named); the other local ranks keep off the terminal: a rank that fails says why
//! on stderr only once the screen has given the terminal back (the screen names the failure
//! meanwhile). `q` on that screen stops the job: this rank stops, and every other one stops at
//! the same step (saving as set).

use super::session::{run_front_end, signal_exit, Session};
use crate::cli::TrainArgs;
use crate::config::RunConfig;
use crate::engine::ranks::JobLink;
use crate::job::JobTag;
use crate::summary::Summary;
use crate::wire::join_many::JoinedMany;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The store key under which each rank says where its socket is (`HOST\nLOCAL_RANK\nPATH`).
const SOCKET_KEY: &str = "socket";
/// The store key under which a screen says it has given the terminal back.
const LEFT_KEY: &str = "screen_left";

/// How long the screen waits for the other ranks to say where their sockets are (they say it
/// as their sessions start, right after the rendezvous).
const SOCKETS_WAIT: Duration = Duration::from_secs(60);
/// How long the screen waits, after this rank stopped, for the other local ranks to end.
const ENDS_WAIT: Duration = Duration::from_secs(10);
/// How long a failed rank keeps its sentence while its host's screen is up.
const HOLD_WAIT: Duration = Duration::from_secs(3600);

/// Where a rank's socket is, as it says in the job's store.
struct RankSocket {
    rank: u32,
    host: String,
    local_rank: u32,
    path: String,
}

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
    let said = format!("{}\n{}\n{path}", tag.host, tag.local_rank);
    link.publish(SOCKET_KEY, said.as_bytes())
}

/// Every rank's socket as it said (waiting up to `wait` for the last).
fn rank_sockets(link: &JobLink, wait: Duration) -> Result<Vec<RankSocket>> {
    let all = link.gather(SOCKET_KEY, &crate::cancel::CancelToken::new(), wait)?;
    Ok(all
        .iter()
        .enumerate()
        .filter_map(|(rank, said)| {
            let text = String::from_utf8_lossy(said);
            let mut parts = text.splitn(3, '\n');
            Some(RankSocket {
                rank: rank as u32,
                host: parts.next()?.to_string(),
                local_rank: parts.next()?.parse().ok()?,
                path: parts.next()?.to_string(),
            })
        })
        .collect())
}

/// A rank that is not its host's screen: trains until the job ends or a signal, quietly.
pub fn quiet(args: &TrainArgs) -> Result<ExitCode> {
    let cfg = RunConfig::from_args(args)?;
    let session = Session::start(&cfg)?;
    while !crate::signals::requested() && !session.pipeline.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let link = session.pipeline.link().cloned();
    let result = session.finish();
    if let (Err(_), Some(link), Some(tag)) = (&result, &link, &cfg.pipeline.job) {
        hold_while_the_screen_is_up(link, tag);
    }
    // Among the ranks' sentences on one terminal, which rank said it.
    let rank = cfg.pipeline.job.as_ref().map_or(0, |t| t.rank);
    result.with_context(|| format!("rank {rank}"))?;
    Ok(signal_exit())
}

/// Waits until this host's screen has given the terminal back (or is gone, or a signal): a
/// sentence written before would scroll it.
fn hold_while_the_screen_is_up(link: &JobLink, tag: &JobTag) {
    let Ok(sockets) = rank_sockets(link, Duration::from_secs(5)) else {
        return;
    };
    let Some(screen) = sockets
        .iter()
        .find(|s| s.host == tag.host && s.local_rank == 0)
    else {
        return;
    };
    let since = Instant::now();
    while !crate::signals::requested() && since.elapsed() < HOLD_WAIT {
        match link.published(LEFT_KEY, screen.rank) {
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            // It left, or the store went with rank 0.
            Ok(Some(_)) | Err(_) => return,
        }
    }
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
    // The terminal is back: the other local ranks may say how they ended.
    if let Some(link) = pipeline.link() {
        let _ = link.publish(LEFT_KEY, b"");
    }
    let finish = session.finish();
    // The job's last figures: the merged view of every local rank's final snapshot, once each
    // has ended (they stop at this rank's last step).
    if let Ok(j) = &joined {
        let waited = Instant::now();
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

/// The sockets of the job's ranks on this host, in rank order.
fn local_sockets(session: &Session, tag: &JobTag) -> Result<Vec<PathBuf>> {
    let link = session
        .pipeline
        .link()
        .context("this process is in no job")?;
    let here: Vec<PathBuf> = rank_sockets(link, SOCKETS_WAIT)?
        .into_iter()
        .filter(|s| s.host == tag.host && !s.path.is_empty())
        .map(|s| PathBuf::from(s.path))
        .collect();
    anyhow::ensure!(!here.is_empty(), "no rank on this host serves a socket");
    Ok(here)
}
