//! `dflash-top attach`: list the running sessions, or join one in the TUI (same keys; the
//! control keys reach the watched process) or headless (the interval lines of `train
//! --headless`). Leaving detaches: the watched run goes on.

use crate::cli::AttachArgs;
use crate::telemetry::flight::FlightRecorder;
use crate::wire::join::{list_text, local_hms, resolve, sessions, Attached};
use crate::wire::serve::socket_dir;
use anyhow::{bail, Result};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub fn run(args: &AttachArgs) -> Result<ExitCode> {
    if args.list {
        let found = sessions();
        if found.is_empty() {
            println!("no running session in {}", socket_dir().display());
        } else {
            println!("{}", list_text(&found));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        bail!("--interval must be a positive number of seconds");
    }
    if let Some(s) = args.seconds.filter(|s| !(*s > 0.0 && s.is_finite())) {
        bail!("--seconds must be a positive number of seconds, not {s}");
    }
    crate::fail_if::headless_only(&args.fail_if, args.headless)?;
    let mut gates = crate::fail_if::Gate::parse_all(&args.fail_if)?;
    // The viewer's own settings from --config: its warning rules and its verdict dwell.
    let (warnings, dwell_ns) = match &args.config {
        Some(p) => {
            let file = crate::config::FileConfig::read(p)?;
            let dwell = crate::config::dwell_ns(file.verdict_dwell)
                .map_err(|e| anyhow::anyhow!("--config {}: {e}", p.display()))?;
            (file.warnings.unwrap_or_default(), dwell)
        }
        None => (Default::default(), crate::telemetry::verdict::DWELL_NS),
    };
    let path = resolve(args.target.as_deref())?;
    let session = Attached::join_with(&path, warnings, dwell_ns)?;
    let who = format!(
        "PID {} ({}, {})",
        session.hello.pid,
        session.hello.program,
        path.display()
    );
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let label = format!(
        "attached to PID {} ({}) since {}",
        session.hello.pid,
        session.hello.program,
        local_hms(since)
    );
    let flight = args
        .flight
        .as_deref()
        .map(|dir| FlightRecorder::start(&session.telemetry, dir))
        .transpose()?;
    let deadline = args
        .seconds
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut tripped = None;
    let result = if args.headless {
        tripped = headless(
            &session,
            &who,
            args.interval,
            deadline,
            &mut gates,
            flight.as_ref(),
        );
        if let Some(why) = &tripped {
            println!("{why}");
            crate::cmd::session::dump_now(flight.as_ref(), why);
        }
        Ok(())
    } else {
        tui(&session, deadline, label)
    };
    let reason = session.end_reason();
    if let Some(f) = flight {
        f.stop();
    }
    session.detach();
    result?;
    if tripped.is_some() {
        eprintln!("detached from {who}: a --fail-if gate held; the run goes on");
        return Ok(ExitCode::from(crate::fail_if::EXIT_CODE));
    }
    match reason {
        Some(why) => eprintln!("detached from {who}: {why}"),
        None => eprintln!("detached from {who}; it goes on"),
    }
    Ok(crate::cmd::session::signal_exit())
}

/// The interval lines until the viewer leaves; the reason when a `--fail-if` gate held.
fn headless(
    session: &Attached,
    who: &str,
    interval: f64,
    deadline: Option<Instant>,
    gates: &mut [crate::fail_if::Gate],
    flight: Option<&FlightRecorder>,
) -> Option<String> {
    println!("attached to {who}");
    let snapshots = session.telemetry.subscribe();
    let interval = Duration::from_secs_f64(interval);
    let mut next = Instant::now() + interval;
    while !crate::signals::requested()
        && !session.ended.load(Ordering::SeqCst)
        && deadline.is_none_or(|d| Instant::now() < d)
    {
        if let Ok(s) = snapshots.recv_timeout(Duration::from_millis(50)) {
            if Instant::now() >= next {
                println!("{}", crate::headless::interval_line(&s));
                next += interval;
            }
            crate::cmd::session::print_dumps(flight);
            if let Some(why) = crate::fail_if::first_tripped(gates, &s) {
                return Some(why);
            }
        }
    }
    None
}

fn tui(session: &Attached, deadline: Option<Instant>, label: String) -> Result<()> {
    use crate::tui::{terminal, EngineControls};
    terminal::install_panic_hook();
    let snapshots = session.telemetry.subscribe();
    let mut ctl = EngineControls::new(&session.telemetry, session.hello.can_save);
    ctl.attached = true;
    ctl.attached_label = Some(label);
    let finished = || {
        if session.ended.load(Ordering::SeqCst) {
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
    crate::cmd::session::run_front_end(&ctl, &snapshots, &finished, Default::default()).map(|_| ())
}
