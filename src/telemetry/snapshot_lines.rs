//! Files of snapshots, one JSON line each: the recordings of earlier versions and the flight
//! recorder's dumps, read by `replay` and `export` (`train --record` writes the frame stream: see
//! `wire::recording`).

use super::snapshot::Snapshot;
use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::path::Path;

/// Reads a recording; a line that is not a snapshot is an error naming the file and line.
pub fn read_recording(path: &Path) -> Result<Vec<Snapshot>> {
    let file = std::fs::File::open(path).with_context(|| {
        format!(
            "cannot open {}: give a file written by `train --record`",
            path.display()
        )
    })?;
    let mut out = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line =
            line.with_context(|| format!("{}: cannot read line {}", path.display(), n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let s: Snapshot = serde_json::from_str(&line).with_context(|| {
            format!(
                "{} line {} is not a dflash-top snapshot: give a file written by `train --record`",
                path.display(),
                n + 1
            )
        })?;
        out.push(s);
    }
    if out.is_empty() {
        bail!(
            "{} holds no snapshot: record a run with `train --record FILE` first",
            path.display()
        );
    }
    Ok(out)
}

/// Writes a hub's snapshots to a file, one JSON line each, at most one every `every` (what
/// `attach --record` keeps of the view it shows, merged or not: `replay` and `export` read it).
pub struct SnapshotRecorder {
    stop: crate::cancel::CancelToken,
    handle: Option<std::thread::JoinHandle<Result<u64>>>,
}

impl SnapshotRecorder {
    /// Creates `path` (an error names it) and follows `telemetry` until `finish`.
    pub fn start(
        telemetry: &super::Telemetry,
        path: &Path,
        every: std::time::Duration,
    ) -> Result<SnapshotRecorder> {
        use std::io::Write;
        let file = std::fs::File::create(path).with_context(|| {
            format!(
                "--record {}: cannot create it: give a writable path",
                path.display()
            )
        })?;
        let mut out = std::io::BufWriter::new(file);
        let rx = telemetry.subscribe();
        let stop = crate::cancel::CancelToken::new();
        let (halt, label) = (stop.clone(), path.display().to_string());
        let handle =
            std::thread::Builder::new()
                .name("record".into())
                .spawn(move || -> Result<u64> {
                    let mut next = std::time::Instant::now();
                    let mut written = 0u64;
                    let mut last = None;
                    while !halt.is_cancelled() {
                        let Ok(s) = rx.recv_timeout(std::time::Duration::from_millis(100)) else {
                            continue;
                        };
                        if std::time::Instant::now() >= next {
                            serde_json::to_writer(&mut out, &*s)?;
                            out.write_all(b"\n")?;
                            written += 1;
                            next += every;
                            last = None;
                        } else {
                            last = Some(s);
                        }
                    }
                    // The last view seen, so the recording ends where the viewer left.
                    if let Some(s) = last {
                        serde_json::to_writer(&mut out, &*s)?;
                        out.write_all(b"\n")?;
                        written += 1;
                    }
                    out.flush()
                        .with_context(|| format!("--record {label}: cannot write it"))?;
                    Ok(written)
                })?;
        Ok(SnapshotRecorder {
            stop,
            handle: Some(handle),
        })
    }

    /// Stops, flushes the file; the number of snapshots it holds.
    pub fn finish(mut self) -> Result<u64> {
        self.stop.cancel();
        match self.handle.take().map(|h| h.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the recording thread panicked"),
            None => Ok(0),
        }
    }
}
