//! `dflash-top train`: a training run with the TUI or headless (interval lines, `--fail-if`
//! gates, the summary line).

use super::session::{job_part, run_front_end, run_info, signal_exit, Session};
use crate::config::cli::TrainArgs;
use crate::config::RunConfig;
use crate::headless::{follow, Follow, Followed};
use crate::summary::Summary;
use anyhow::Result;
use std::process::ExitCode;
use std::time::Duration;

pub fn headless(args: &TrainArgs) -> Result<ExitCode> {
    let mut gates = crate::fail_if::Gate::parse_all(&args.fail_if)?;
    let cfg = RunConfig::from_args(args)?.apply()?;
    let job = cfg.pipeline.job.as_ref();
    // In a job, which rank this is (the recipe before it is what every rank agrees on).
    let rank_fields = job.map(|t| t.config_fields(cfg.pipeline.drafter_devices.len()));
    crate::signals::print_line(&format!(
        "{}{}",
        cfg.pipeline.recipe_line(),
        rank_fields.unwrap_or_default()
    ));
    let session = Session::start(&cfg)?;
    if let Some(s) = &session.server {
        crate::signals::print_line(&format!(
            "attach: dflash-top attach {} (socket {})",
            std::process::id(),
            s.path.display()
        ));
    }
    let snapshots = session.telemetry.subscribe();
    let start_step = session.pipeline.start_step;
    let counts = session.pipeline.counts.clone();
    let pipeline = &session.pipeline;
    let how = Follow {
        interval: Duration::from_secs_f64(cfg.viewer.interval),
        deadline: None,
        ended: &|| pipeline.is_finished(),
        flight: session.flight.as_ref(),
        job,
    };
    // A gate that held stops the run as on any stop (saving its step).
    let Followed { mut last, tripped } = follow(&snapshots, &mut gates, &how);
    let telemetry = session.telemetry.clone();
    // Held past the session: rank 0 hosts the job's store until the others' figures are in.
    let link = session.pipeline.link().cloned();
    let result = session.finish();
    // The step the run ended (and saved) at: the feed may have filled up during the save.
    last = telemetry.last_snapshot().or(last);
    result?;
    if let Some(s) = last {
        let mut summary = Summary::of(&s, &run_info(&cfg, start_step));
        summary.job = link.as_deref().map(|l| job_part(l, &summary));
        crate::signals::print_result_line(&summary.line());
    }
    crate::signals::print_result_line(&format!("data: {}", counts.line()));
    if tripped.is_some() {
        return Ok(ExitCode::from(crate::fail_if::EXIT_CODE));
    }
    Ok(signal_exit())
}

pub fn tui(args: &TrainArgs) -> Result<ExitCode> {
    use crate::tui::{terminal, EngineControls};
    crate::fail_if::headless_only(&args.fail_if, false)?;
    // The ranks of a job share their host's terminal: one draws them all, the others keep off
    // it (before any of them touches the terminal's settings).
    if let Some(tag) = crate::job::JobTag::from_env().map_err(|e| anyhow::anyhow!("{e}"))? {
        return match tag.local_rank {
            0 => super::job_screen::screen(args, &tag),
            _ => super::job_screen::quiet(args),
        };
    }
    // Keys typed while the run starts (the model loads) neither echo over the shell nor reach
    // the screen; the echo comes back on every way out.
    let _hushed = terminal::hush_input();
    let cfg = RunConfig::from_args(args)?.apply()?;
    // Before any worker starts: a panic in any thread, from now on, restores the terminal.
    terminal::install_panic_hook();
    if let Some(file) = crate::fault::arg("hold_start") {
        while !std::path::Path::new(file).exists() && !crate::signals::requested() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // A bad UI config is a sentence before any worker starts (the front-end reads it again).
    crate::tui::settings::load(&Default::default())?;
    let session = Session::start(&cfg)?;
    let snapshots = session.telemetry.subscribe();
    let ctl = EngineControls::new(&session.telemetry, cfg.pipeline.save_dir.is_some());
    let pipeline = &session.pipeline;
    let finished = || session.end_note();
    let info = run_info(&cfg, pipeline.start_step);
    let shown = run_front_end(&ctl, &snapshots, &finished, info.clone());
    let telemetry = session.telemetry.clone();
    let finish = session.finish();
    // The hub's last snapshot, published as the run stopped: the step it ended (and saved) at,
    // which may be past the last one shown.
    let last = shown?.and(telemetry.last_snapshot());
    finish?;
    // The run's summary, after the last save (a run stopped by `q` saves on the way out).
    if let Some(s) = last {
        crate::signals::print_result_line(&Summary::of(&s, &info).line());
    }
    Ok(signal_exit())
}
