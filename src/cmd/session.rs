//! What the commands share: a training `Session` (hub + pipeline + socket + recording + flight
//! recorder; in a job, where its socket is, said in the job's store), the TUI's front-end loop,
//! and the exit status after a signal.

use crate::cancel::CancelToken;
use crate::config::RunConfig;
use crate::engine::parallel::ranks::JobLink;
use crate::engine::pipeline::Pipeline;
use crate::summary::{JobPart, JobTotals, RankFigures, RunInfo, Summary};
use crate::telemetry::flight::FlightRecorder;
use crate::telemetry::Telemetry;
use crate::tui::End;
use crate::wire::fanout::Fanout;
use crate::wire::recording::Recorder;
use crate::wire::serve::{ServeLimits, Server};
use anyhow::Result;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// A running training session: hub + pipeline.
pub struct Session {
    pub telemetry: Telemetry,
    pub pipeline: Pipeline,
    hub_cancel: CancelToken,
    hub: std::thread::JoinHandle<()>,
    recorder: Option<Recorder>,
    /// The last minute, dumped when something goes wrong (None without a place for dumps).
    pub flight: Option<FlightRecorder>,
    /// The socket viewers attach to (None when it could not be opened: the run goes on).
    pub server: Option<Server>,
}

impl Session {
    pub fn start(cfg: &RunConfig) -> Result<Session> {
        let mut telemetry = Telemetry::new();
        telemetry.warnings = cfg.viewer.warnings.clone();
        telemetry.verdict_dwell_ns = cfg.viewer.verdict_dwell_ns;
        telemetry.switches().set_gpu_timing(cfg.viewer.gpu_timing);
        telemetry.switches().set_profiling(cfg.viewer.profiling);
        telemetry
            .switches()
            .set_stage_ratio_flops(cfg.pipeline.flop_ratio);
        // Why CUPTI does not count (said in snapshots and, through the switches, the hello).
        telemetry.switches().set_cupti(cfg.pipeline.cupti.why_not());
        // The job this process is one rank of, said in the hello and beside the socket.
        let job = cfg.pipeline.job.clone();
        // Raw records and queue samples go out to viewers and the recording as they pass the hub.
        let fanout = Fanout::tap_job(
            &telemetry,
            cfg.pipeline.save_dir.is_some(),
            Some(cfg.pipeline.recipe_line()),
            job,
        );
        let recorder = cfg
            .viewer
            .record
            .as_deref()
            .map(|path| Recorder::start(&fanout, path, &telemetry))
            .transpose()?;
        let limits = ServeLimits {
            max_viewers: cfg.viewer.max_viewers,
            ..ServeLimits::default()
        };
        let server = match Server::start(&fanout, &telemetry, limits) {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("dflash-top: no socket for `attach` ({e:#}); training goes on");
                None
            }
        };
        let flight = cfg
            .viewer
            .flight
            .as_deref()
            .map(|dir| FlightRecorder::start(&telemetry, dir))
            .transpose()?;
        let pipeline = Pipeline::start(&cfg.pipeline, &telemetry)?;
        let hub_cancel = CancelToken::new();
        let hub = telemetry.spawn_hub(hub_cancel.clone())?;
        let session = Session {
            telemetry,
            pipeline,
            hub_cancel,
            hub,
            recorder,
            flight,
            server,
        };
        // In a job, where this rank's socket is, for the screen of its host.
        if let Some(tag) = &cfg.pipeline.job {
            if let Err(e) = session.announce_socket(tag) {
                let _ = session.finish();
                return Err(e);
            }
        }
        Ok(session)
    }

    /// Says in the job's store where this rank's socket is (an empty path when it serves none).
    fn announce_socket(&self, tag: &crate::job::JobTag) -> Result<()> {
        let Some(link) = self.pipeline.link() else {
            return Ok(());
        };
        let path = self
            .server
            .as_ref()
            .map(|s| s.path.display().to_string())
            .unwrap_or_default();
        link.publish(SOCKET_KEY, format!("{}\n{path}", tag.host).as_bytes())
    }

    /// What the screen says once the run has ended (None while it runs).
    pub fn end_note(&self) -> Option<End> {
        let pipeline = &self.pipeline;
        pipeline.is_finished().then(|| End {
            note: match pipeline.first_error() {
                Some(e) => format!("stopped: {e} (q to leave)"),
                None => "run finished: press q to leave".to_string(),
            },
            run_ended: true,
        })
    }

    /// Stops the pipeline (saving as configured) and then the hub, which publishes a last
    /// snapshot.
    pub fn finish(self) -> Result<()> {
        let result = self.pipeline.stop();
        self.hub_cancel.cancel();
        let _ = self.hub.join();
        if let Some(f) = self.flight {
            f.stop();
        }
        if let Some(server) = self.server {
            server.stop();
        }
        // A recording that failed was reported when it did (the header, the headless lines)
        // and training went on: said once more here, it does not fail the run.
        if let Some(Err(e)) = self.recorder.map(Recorder::finish) {
            eprintln!("dflash-top: {e:#}");
        }
        result
    }
}

/// The store key under which each rank of a job says where its socket is (`HOST\nPATH`).
const SOCKET_KEY: &str = "socket";

/// Where rank `rank` of the job said its socket is, once it has: (its host, the path; empty
/// where it serves none).
pub(crate) fn socket_of_rank(link: &JobLink, rank: u32) -> Result<Option<(String, String)>> {
    let Some(said) = link.published(SOCKET_KEY, rank)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&said);
    let (host, path) = text.split_once('\n').unwrap_or((&text, ""));
    Ok(Some((host.to_string(), path.to_string())))
}

/// The store key under which each rank of a job leaves its final figures for rank 0's summary.
const FIGURES_KEY: &str = "summary";
/// How long rank 0 waits for the other ranks' figures (each leaves them as its run ends, a
/// moment after rank 0's, which saves last).
const FIGURES_WAIT: Duration = Duration::from_secs(20);

/// This rank's part of its `summary:` line, after its run ended well: a rank other than 0
/// leaves its figures in the job's store; rank 0 (which hosts the store, or reaches torchrun's)
/// waits up to `FIGURES_WAIT` for theirs and adds the job's totals, naming a rank whose
/// figures did not come.
pub(crate) fn job_part(link: &JobLink, summary: &Summary) -> JobPart {
    let tag = &link.tag;
    let mine = summary.figures(tag.rank);
    let part = |totals| JobPart {
        rank: tag.rank,
        world: tag.world,
        totals,
    };
    if tag.rank != 0 {
        // Unheard if rank 0 has gone already (it waits no longer than `FIGURES_WAIT`): its
        // line then names this rank as missing.
        if let Ok(text) = serde_json::to_vec(&mine) {
            let _ = link.publish(FIGURES_KEY, &text);
        }
        return part(None);
    }
    let mut got: Vec<Option<RankFigures>> = (0..tag.world).map(|_| None).collect();
    got[0] = Some(mine);
    let deadline = Instant::now() + FIGURES_WAIT;
    loop {
        for (r, slot) in got.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
            let said = link.published(FIGURES_KEY, r as u32).ok().flatten();
            *slot = said.and_then(|v| serde_json::from_slice(&v).ok());
        }
        if got.iter().all(Option::is_some) || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    part(Some(JobTotals {
        reported: got.into_iter().flatten().collect(),
    }))
}

/// Where a run's files go, for its summary.
pub(crate) fn run_info(cfg: &RunConfig, start_step: u64) -> RunInfo {
    RunInfo {
        start_step,
        save_dir: cfg.pipeline.save_dir.clone(),
        recording: cfg.viewer.record.clone(),
        steps: cfg.pipeline.steps,
        model: crate::engine::spec::model_label(&cfg.pipeline.recipe_line()),
    }
}

/// After a graceful stop: success, or 130 (the shell's "interrupted") when a signal asked for
/// it, so that `train && next` does not go on after an interrupted run.
pub(crate) fn signal_exit() -> ExitCode {
    if crate::signals::requested() {
        eprintln!(
            "dflash-top: stopped by a signal (the last step was saved where --save-dir is set)"
        );
        ExitCode::from(crate::signals::FORCED_EXIT as u8)
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs the TUI on `snapshots` until the user quits (or a thread panics); the terminal is
/// restored before this returns, and a held-back panic message printed after it. Returns the
/// last snapshot shown (for the exit summary).
pub(crate) fn run_front_end(
    ctl: &dyn crate::tui::controls::Controls,
    snapshots: &crossbeam_channel::Receiver<std::sync::Arc<crate::telemetry::Snapshot>>,
    finished: &dyn Fn() -> Option<End>,
    info: RunInfo,
) -> Result<Option<std::sync::Arc<crate::telemetry::Snapshot>>> {
    use crate::tui::{self, app::App, terminal};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // A bad UI config is a sentence before the screen is taken.
    let ui = tui::settings::load(&ctl.names())?;
    let (mut term, guard) = terminal::init()?;
    let stop_input = Arc::new(AtomicBool::new(false));
    let (input, input_thread) = tui::spawn_input(stop_input.clone())?;
    let mut app = App::new();
    app.keys = ui.keys;
    app.run_info = info;
    app.replay = ctl.replay().is_some();
    app.attached = ctl.attached();
    app.quit_stops_run = ctl.quit_stops_run();
    let result = tui::run_loop(
        &mut term, &mut app, ctl, snapshots, &input, finished, ui.theme,
    );
    stop_input.store(true, Ordering::Relaxed);
    // After a hang-up (the terminal closed under us) crossterm's read can spin inside its poll
    // and never see `stop`: wait a moment, then leave the thread to end with the process, so
    // that the pipeline still stops and saves.
    let waited = Instant::now();
    while !input_thread.is_finished() && waited.elapsed() < Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if input_thread.is_finished() {
        let _ = input_thread.join();
    }
    // Not dropped: ratatui's Drop shows the cursor and, when that fails (the terminal hung
    // up), eprintln!s — a panic with stderr gone, before the pipeline could save. The guard
    // below shows the cursor and leaves raw mode itself.
    std::mem::forget(term);
    drop(guard);
    if terminal::PANICKED.load(Ordering::SeqCst) {
        if let Some(msg) = terminal::take_held_panic() {
            eprintln!("{msg}");
        }
        anyhow::bail!("a thread panicked (the message is above); the terminal was restored");
    }
    result.map(|()| app.latest)
}
