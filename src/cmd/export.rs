//! `dflash-top export`: a recording's steps as a Chrome trace.

use crate::wire::recording::{self, Recording};
use anyhow::Result;
use std::process::ExitCode;

/// `dflash-top export FILE --chrome OUT.json [--seconds N]`.
pub fn run(
    file: &std::path::Path,
    out: &std::path::Path,
    seconds: Option<f64>,
) -> Result<ExitCode> {
    use crate::telemetry::trace;
    let (mut spans, names) = match recording::read(file)? {
        Recording::Frames(msgs) => {
            if let Some(line) = recording::config_line(&msgs) {
                crate::signals::outln!("recorded run: {line}");
            }
            recording::spans(&msgs)?
        }
        Recording::Snapshots(snaps) => {
            // The names of the pipeline as the last snapshot has them.
            let names = snaps.last().map(|s| (*s.names).clone()).unwrap_or_default();
            (snaps.into_iter().flat_map(|s| s.steps).collect(), names)
        }
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
    trace::write_trace(out, &spans, &names)?;
    crate::signals::outln!(
        "wrote {} ({}) — open it in https://ui.perfetto.dev",
        out.display(),
        trace::describe(&spans)
    );
    Ok(ExitCode::SUCCESS)
}
