//! Dispatches a parsed command line to the part of the program that does it.

use crate::cancel::CancelToken;
use crate::cli::{Command, TrainArgs};
use crate::config::RunConfig;
use crate::engine::pipeline::Pipeline;
use crate::summary::{RunInfo, Summary};
use crate::telemetry::flight::FlightRecorder;
use crate::telemetry::Telemetry;
use crate::tui::End;
use crate::wire::fanout::Fanout;
use crate::wire::recording::{self, Recorder, Recording};
use crate::wire::serve::{ServeLimits, Server};
use anyhow::Result;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub fn run(command: Command) -> Result<ExitCode> {
    if matches!(
        command,
        Command::Train(_) | Command::Bench(_) | Command::Replay { .. } | Command::Attach(_)
    ) {
        crate::signals::install();
    }
    match command {
        Command::Doctor => {
            print!("{}", crate::doctor::report());
            Ok(ExitCode::SUCCESS)
        }
        Command::Train(args) if args.headless => train_headless(&args),
        Command::Train(args) => train_tui(&args),
        Command::Bench(args) => crate::bench::run(&args),
        Command::Export {
            file,
            chrome,
            seconds,
        } => export(&file, &chrome, seconds),
        Command::Replay { file } => replay(&file),
        Command::Generate(args) => crate::generate::run(&args),
        Command::Attach(args) => crate::attach::run(&args),
    }
}

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
            .set_stage_ratio_flops(crate::engine::flops::flop_ratio(
                &cfg.pipeline.target_config,
                &cfg.pipeline.drafter_spec,
                cfg.pipeline.seq_len,
                cfg.pipeline.anchors,
            ));
        // Raw records and queue samples go out to viewers and the recording as they pass the hub.
        let fanout = Fanout::tap(
            &telemetry,
            cfg.pipeline.save_dir.is_some(),
            Some(cfg.pipeline.recipe_line()),
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
        Ok(Session {
            telemetry,
            pipeline,
            hub_cancel,
            hub,
            recorder,
            flight,
            server,
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

fn train_headless(args: &TrainArgs) -> Result<ExitCode> {
    let mut gates = crate::fail_if::Gate::parse_all(&args.fail_if)?;
    let cfg = RunConfig::from_args(args)?;
    println!("{}", cfg.pipeline.recipe_line());
    let session = Session::start(&cfg)?;
    if let Some(s) = &session.server {
        println!(
            "attach: dflash-top attach {} (socket {})",
            std::process::id(),
            s.path.display()
        );
    }
    let snapshots = session.telemetry.subscribe();
    let start_step = session.pipeline.start_step;
    let counts = session.pipeline.counts.clone();
    let interval = Duration::from_secs_f64(cfg.viewer.interval);
    let mut next = Instant::now() + interval;
    let mut last = None;
    let mut tripped = None;
    while !session.pipeline.is_finished() && !crate::signals::requested() {
        if let Ok(s) = snapshots.recv_timeout(Duration::from_millis(50)) {
            if Instant::now() >= next {
                println!("{}", crate::headless::interval_line(&s));
                next += interval;
            }
            tripped = crate::fail_if::first_tripped(&mut gates, &s);
            last = Some(s);
            print_dumps(session.flight.as_ref());
            if tripped.is_some() {
                break;
            }
        }
    }
    // A gate that held: its reason and the last minute, then the run stops as on any stop
    // (saving its step).
    if let Some(why) = &tripped {
        println!("{why}");
        dump_now(session.flight.as_ref(), why);
    }
    let result = session.finish();
    while let Ok(s) = snapshots.try_recv() {
        last = Some(s);
    }
    result?;
    if let Some(s) = last {
        println!("{}", Summary::of(&s, &run_info(&cfg, start_step)).line());
    }
    println!("data: {}", counts.line());
    if tripped.is_some() {
        return Ok(ExitCode::from(crate::fail_if::EXIT_CODE));
    }
    Ok(signal_exit())
}

/// Prints the flight recorder's new dumps, one `flight:` line each.
pub(crate) fn print_dumps(flight: Option<&FlightRecorder>) {
    for d in flight.map(FlightRecorder::take_new).unwrap_or_default() {
        println!("{}", d.line());
    }
}

/// A dump because a `--fail-if` gate held (unless one was written in the last minute).
pub(crate) fn dump_now(flight: Option<&FlightRecorder>, why: &str) {
    match flight.and_then(|f| f.dump_now(why)) {
        Some(Ok(d)) => println!("{}", d.line()),
        Some(Err(e)) => eprintln!("dflash-top: {e:#}"),
        None => {}
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

fn train_tui(args: &TrainArgs) -> Result<ExitCode> {
    use crate::tui::{terminal, EngineControls};
    crate::fail_if::headless_only(&args.fail_if, false)?;
    // Keys typed while the run starts (the model loads) neither echo over the shell nor reach
    // the screen; the echo comes back on every way out.
    let _hushed = terminal::hush_input();
    let cfg = RunConfig::from_args(args)?;
    // Before any worker starts: a panic in any thread, from now on, restores the terminal.
    terminal::install_panic_hook();
    if let Some(file) = crate::fault::arg("hold_start") {
        while !std::path::Path::new(file).exists() && !crate::signals::requested() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // A bad UI config is a sentence before any worker starts (the front-end reads it again).
    crate::tui::config::load()?;
    let session = Session::start(&cfg)?;
    let snapshots = session.telemetry.subscribe();
    let ctl = EngineControls::new(&session.telemetry, cfg.pipeline.save_dir.is_some());
    let pipeline = &session.pipeline;
    let finished = || {
        pipeline.is_finished().then(|| End {
            note: match pipeline.first_error() {
                Some(e) => format!("stopped: {e} (q to leave)"),
                None => "run finished: press q to leave".to_string(),
            },
            run_ended: true,
        })
    };
    let info = run_info(&cfg, pipeline.start_step);
    let shown = run_front_end(&ctl, &snapshots, &finished, info.clone());
    let finish = session.finish();
    let last = shown?;
    finish?;
    // The same summary as the panel's, after the last save (a run stopped by `q` saves on
    // the way out).
    if let Some(s) = last {
        println!("{}", Summary::of(&s, &info).line());
    }
    Ok(signal_exit())
}

/// Where a run's files go, for its summary.
fn run_info(cfg: &RunConfig, start_step: u64) -> RunInfo {
    RunInfo {
        start_step,
        save_dir: cfg.pipeline.save_dir.clone(),
        recording: cfg.viewer.record.clone(),
        steps: cfg.pipeline.steps,
    }
}

/// Runs the TUI on `snapshots` until the user quits (or a thread panics); the terminal is
/// restored before this returns, and a held-back panic message printed after it. Returns the
/// last snapshot shown (for the exit summary).
pub(crate) fn run_front_end(
    ctl: &dyn crate::tui::app::Controls,
    snapshots: &crossbeam_channel::Receiver<std::sync::Arc<crate::telemetry::Snapshot>>,
    finished: &dyn Fn() -> Option<End>,
    info: RunInfo,
) -> Result<Option<std::sync::Arc<crate::telemetry::Snapshot>>> {
    use crate::tui::{self, app::App, terminal};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // A bad UI config is a sentence before the screen is taken.
    let ui = tui::config::load()?;
    let (mut term, guard) = terminal::init()?;
    let stop_input = Arc::new(AtomicBool::new(false));
    let (input, input_thread) = tui::spawn_input(stop_input.clone())?;
    let mut app = App::new();
    app.keys = ui.keys;
    app.run_info = info;
    app.replay = ctl.replay().is_some();
    app.attached = ctl.attached();
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

/// `dflash-top export FILE --chrome OUT.json [--seconds N]`.
fn export(file: &std::path::Path, out: &std::path::Path, seconds: Option<f64>) -> Result<ExitCode> {
    use crate::telemetry::trace;
    let mut spans: Vec<_> = match recording::read(file)? {
        Recording::Frames(msgs) => {
            if let Some(line) = recording::config_line(&msgs) {
                println!("recorded run: {line}");
            }
            recording::spans(&msgs)?
        }
        Recording::Snapshots(snaps) => snaps.into_iter().flat_map(|s| s.steps).collect(),
    };
    if spans.is_empty() {
        anyhow::bail!(
            "{} holds no step spans to trace: record with this version's `train --record`",
            file.display()
        );
    }
    if let Some(s) = seconds {
        if s.is_nan() || s <= 0.0 {
            anyhow::bail!("--seconds must be a positive number");
        }
        spans = trace::last_seconds(&spans, s);
    }
    trace::write_trace(out, &spans)?;
    println!(
        "wrote {} ({}) — open it in https://ui.perfetto.dev",
        out.display(),
        trace::describe(&spans)
    );
    Ok(ExitCode::SUCCESS)
}

/// `dflash-top replay FILE`: the recorded run in the same TUI, steered: space pauses, `<` `>`
/// and the arrows seek by 10 s, `,` `.` set the speed; at the end of the recording, its summary
/// (on screen, and on exit as after a live run).
fn replay(file: &std::path::Path) -> Result<ExitCode> {
    use crate::tui::{terminal, PlayerControls};
    use crate::wire::replay::{Player, Source};
    let source = Source::new(recording::read(file)?)?;
    terminal::install_panic_hook();
    let player = Player::start(source)?;
    let ctl = PlayerControls { player: &player };
    let finished = || {
        player.pos().at_end.then(|| End {
            note: "end of recording: < or ← seeks back, q leaves".into(),
            run_ended: true,
        })
    };
    let info = RunInfo {
        recording: Some(file.to_path_buf()),
        ..RunInfo::default()
    };
    let shown = run_front_end(&ctl, &player.snapshots, &finished, info.clone());
    let pos = player.pos();
    player.stop();
    let last = shown?;
    match last {
        Some(s) if pos.at_end => println!("{}", Summary::of(&s, &info).line()),
        _ => println!(
            "replay left at t={} / {}",
            crate::tui::app::fmt_clock(pos.position_s),
            crate::tui::app::fmt_clock(pos.duration_s)
        ),
    }
    Ok(signal_exit())
}
