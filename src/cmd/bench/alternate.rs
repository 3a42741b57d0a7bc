//! `bench modes` and `bench profiling`: settings that take turns on one pipeline, so that a shared
//! machine's drift hits them alike.

use super::rates::phase_line;
use crate::cmd::session::Session;
use crate::config::cli::BenchArgs;
use crate::config::RunConfig;
use crate::telemetry::{HubCommand, Snapshot};
use anyhow::{bail, Result};
use crossbeam_channel::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(super) struct Setting {
    pub(super) name: &'static str,
    pub(super) command: HubCommand,
}

/// The snapshots published during the next `d` (or until the run ends).
fn snapshots_for(
    rx: &Receiver<Arc<Snapshot>>,
    d: Duration,
    session: &Session,
) -> Vec<Arc<Snapshot>> {
    let end = Instant::now() + d;
    let mut out = Vec::new();
    while Instant::now() < end && !session.pipeline.is_finished() && !crate::signals::requested() {
        if let Ok(s) = rx.recv_timeout(Duration::from_millis(50)) {
            out.push(s);
        }
    }
    out.extend(rx.try_iter());
    out
}

/// Runs the settings in turn, `--segment` seconds each, `--rounds` times after a warm-up turn;
/// reports tok/s per setting — the mean of the 1 s tok/s (steps in progress prorated, so not
/// quantised to whole steps) over each segment less its first second, whose window still holds
/// the previous setting — with its ratio to the first setting, and each thread's phase times in
/// the setting's last segment.
pub(super) fn alternate(args: &BenchArgs, run: &RunConfig, settings: &[Setting]) -> Result<()> {
    if !(args.segment >= 2.0 && args.segment.is_finite()) {
        bail!("--segment must be at least 2 seconds");
    }
    if args.rounds == 0 {
        bail!("--rounds 0 measures nothing (the first turn is a warm-up): give 1 or more");
    }
    let session = Session::start(run)?;
    let cfg = &run.pipeline;
    let rx = session.telemetry.subscribe();
    let settle = Duration::from_secs(1);
    let measure = Duration::from_secs_f64(args.segment - 1.0);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); settings.len()];
    let mut last: Vec<Option<Arc<Snapshot>>> = vec![None; settings.len()];
    for round in 0..=args.rounds {
        for (i, s) in settings.iter().enumerate() {
            session.telemetry.command(s.command.clone());
            snapshots_for(&rx, settle, &session);
            let measured = snapshots_for(&rx, measure, &session);
            if crate::signals::requested() {
                session.finish()?;
                bail!("stopped by a signal: the benchmark is incomplete, nothing to report");
            }
            if measured.is_empty() {
                bail!(
                    "the run ended during the benchmark: {}",
                    session
                        .pipeline
                        .first_error()
                        .unwrap_or_else(|| "no error was reported".into())
                );
            }
            if round > 0 {
                rates[i].extend(measured.iter().map(|s| s.train.tok_per_s_1s));
                last[i] = measured.last().cloned();
            }
        }
    }
    session.finish()?;
    let rate = |i: usize| rates[i].iter().sum::<f64>() / rates[i].len().max(1) as f64;
    crate::signals::outln!(
        "bench: preset={} devices target={:?} drafter={:?} rounds={} segment={}s",
        cfg.preset.name,
        cfg.target_devices,
        cfg.drafter_devices,
        args.rounds,
        args.segment
    );
    for (i, s) in settings.iter().enumerate() {
        crate::signals::outln!(
            "bench: {} tok/s={:.0} ratio={:.4} (vs {})",
            s.name,
            rate(i),
            rate(i) / rate(0).max(1e-9),
            settings[0].name
        );
        if let Some(snap) = &last[i] {
            for t in &snap.threads {
                crate::signals::outln!("bench: {} {}", s.name, phase_line(t));
            }
        }
    }
    Ok(())
}
