//! `dflash-top train` with its TUI in a torchrun-style job, where the ranks of a host share one
//! terminal: one screen a host. The process of LOCAL_RANK 0 draws every rank of the job on this
//! host, merged as `attach --job` merges them (threads `r1/drafter-0`, tok/s summed, the
//! slowest rank named); the other local ranks keep off the terminal: a rank that fails while the
//! screen is up says why on stderr only once the screen has given the terminal back (the screen
//! names the failure meanwhile). `q` on that screen stops the job: this rank stops, and every
//! other one stops at the same step (saving as set).

use super::session::{run_front_end, run_info, signal_exit, socket_of_rank, Session};
use crate::config::cli::TrainArgs;
use crate::config::RunConfig;
use crate::engine::parallel::ranks::JobLink;
use crate::job::JobTag;
use crate::summary::Summary;
use crate::wire::join_many::JoinedMany;
use anyhow::anyhow;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The store key under which a host's screen says whether it holds the terminal (`up`, `left`).
fn screen_key(host: &str) -> String {
    format!("screen/{host}")
}

/// How long the screen waits for the other ranks to say where their sockets are (they say it
/// as their sessions start, right after the rendezvous).
const SOCKETS_WAIT: Duration = Duration::from_secs(60);
/// How long the screen waits, after this rank stopped, for the other local ranks to end.
const ENDS_WAIT: Duration = Duration::from_secs(10);
/// How long a failed rank keeps its sentence while its host's screen is up.
const HOLD_WAIT: Duration = Duration::from_secs(3600);

/// A rank that is not its host's screen: trains until the job ends or a signal, quietly (a
/// signal's stop says nothing either: the screen says it for the job).
pub fn quiet(args: &TrainArgs) -> Result<ExitCode> {
    let cfg = RunConfig::from_args(args)?.apply()?;
    let tag = cfg.pipeline.job.clone().context("a job's rank")?;
    let mut link = None;
    let result = (|| {
        let session = Session::start(&cfg)?;
        while !crate::signals::requested() && !session.pipeline.is_finished() {
            std::thread::sleep(Duration::from_millis(50));
        }
        link = session.pipeline.link().cloned();
        session.finish()
    })();
    if let (Err(_), Some(link)) = (&result, &link) {
        hold_while_the_screen_is_up(link, &tag);
    }
    // Among the ranks' sentences on one terminal, which rank said it.
    result.with_context(|| format!("rank {}", tag.rank))?;
    Ok(match crate::signals::requested() {
        true => ExitCode::from(crate::signals::FORCED_EXIT as u8),
        false => ExitCode::SUCCESS,
    })
}

/// Waits while this host's screen holds the terminal (or until it is gone, or a signal): a
/// sentence written meanwhile would scroll it.
fn hold_while_the_screen_is_up(link: &JobLink, tag: &JobTag) {
    let since = Instant::now();
    while !crate::signals::requested() && since.elapsed() < HOLD_WAIT {
        match link.read(&screen_key(&tag.host)) {
            Ok(Some(said)) if said == b"up" => std::thread::sleep(Duration::from_millis(100)),
            // None up yet (none at all: LOCAL_RANK 0 runs headless), it left, or the store
            // went with rank 0.
            _ => return,
        }
    }
}

/// The screen of this host's ranks (this process is LOCAL_RANK 0 of `tag`'s job).
pub fn screen(args: &TrainArgs, tag: &JobTag) -> Result<ExitCode> {
    use crate::tui::{terminal, EngineControls};
    let _hushed = terminal::hush_input();
    let cfg = RunConfig::from_args(args)?.apply()?;
    terminal::install_panic_hook();
    crate::tui::settings::load(&Default::default())?;
    let session = Session::start(&cfg)?;
    let viewer = &cfg.viewer;
    // Every local rank merged; failing that (no socket, --max-viewers 0), this rank alone.
    let joined = local_sockets(&session, tag).and_then(|paths| {
        JoinedMany::join(&paths, viewer.warnings.clone(), viewer.verdict_dwell_ns)
    });
    // Which rank draws it, in the words of its `config:` line (`job=ID rank=R/W local_rank=L`).
    let me = tag
        .config_fields(cfg.pipeline.drafter_devices.len())
        .trim_start()
        .to_string();
    let (telemetry, label) = match &joined {
        Ok(j) => (
            j.telemetry.clone(),
            format!("{me}; on this screen: {}", j.who()),
        ),
        Err(e) => (
            session.telemetry.clone(),
            format!("{me} alone on this screen ({e:#})"),
        ),
    };
    let snapshots = telemetry.subscribe();
    let mut ctl = EngineControls::new(&telemetry, cfg.pipeline.save_dir.is_some());
    ctl.attached_label = Some(label);
    let pipeline = &session.pipeline;
    let finished = || session.end_note();
    let info = run_info(&cfg, pipeline.start_step);
    let say = |what: &[u8]| {
        if let Some(link) = pipeline.link() {
            let _ = link.write(&screen_key(&tag.host), what);
        }
    };
    say(b"up");
    let shown = run_front_end(&ctl, &snapshots, &finished, info.clone());
    // The terminal is back: the other local ranks may say how they ended.
    say(b"left");
    let finish = session.finish();
    // The job's last figures: the merged view of every local rank's final snapshot, once each
    // has ended (they stop at this rank's last step).
    if let Ok(j) = &joined {
        let waited = Instant::now();
        while !j.ended.load(std::sync::atomic::Ordering::SeqCst) && waited.elapsed() < ENDS_WAIT {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let last = shown?.and(telemetry.last_snapshot());
    if let Ok(j) = joined {
        j.detach();
    }
    finish?;
    // The job's summary on this host (the ranks' steps and tokens merged).
    if let Some(s) = last {
        crate::signals::outln!("{}", Summary::of(&s, &info).line());
    }
    Ok(signal_exit())
}

/// The sockets of the job's ranks on this host, in rank order, as each says it at its start:
/// every rank's word is awaited (up to `SOCKETS_WAIT`), or this host's `LOCAL_WORLD_SIZE` of
/// them where the launcher set it.
fn local_sockets(session: &Session, tag: &JobTag) -> Result<Vec<PathBuf>> {
    let link = session
        .pipeline
        .link()
        .context("this process is in no job")?;
    let local_world: Option<usize> = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    // (host, path) as each rank said it.
    let mut said: Vec<Option<(String, String)>> = (0..tag.world).map(|_| None).collect();
    let since = Instant::now();
    loop {
        for (r, slot) in said.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
            *slot = socket_of_rank(link, r as u32)?;
        }
        let here: Vec<&(String, String)> = said
            .iter()
            .flatten()
            .filter(|(host, _)| *host == tag.host)
            .collect();
        let complete =
            said.iter().all(Option::is_some) || local_world.is_some_and(|n| here.len() >= n);
        if complete {
            let paths: Vec<PathBuf> = here
                .iter()
                .filter(|(_, path)| !path.is_empty())
                .map(|(_, path)| PathBuf::from(path))
                .collect();
            anyhow::ensure!(!paths.is_empty(), "no rank on this host serves a socket");
            return Ok(paths);
        }
        if crate::signals::requested() || session.pipeline.is_finished() {
            return Err(anyhow!(
                "the run stopped before every rank said where its socket is"
            ));
        }
        if since.elapsed() > SOCKETS_WAIT {
            let missing = said.iter().filter(|s| s.is_none()).count();
            return Err(anyhow!(
                "{missing} rank(s) did not say where their sockets are within {} s",
                SOCKETS_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
