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
