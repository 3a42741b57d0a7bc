//! Record and replay: every snapshot as one JSON line (`train --record FILE`), read back by
//! `replay` and `export`.

use super::snapshot::Snapshot;
use crate::cancel::CancelToken;
use anyhow::{bail, Context, Result};
use crossbeam_channel::Receiver;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Writes every snapshot from `rx` to `path` until `stop` is set and the feed is drained.
/// The file is created now, so a bad path is reported before training starts.
pub fn spawn_recorder(
    rx: Receiver<Arc<Snapshot>>,
    path: &Path,
    stop: CancelToken,
) -> Result<JoinHandle<Result<()>>> {
    let file = std::fs::File::create(path).with_context(|| {
        format!(
            "--record {}: cannot create the file; check the directory",
            path.display()
        )
    })?;
    let path: PathBuf = path.to_path_buf();
    let handle = std::thread::Builder::new()
        .name("recorder".into())
        .spawn(move || {
            let mut out = BufWriter::new(file);
            let mut write = |s: &Snapshot| -> Result<()> {
                serde_json::to_writer(&mut out, s)?;
                out.write_all(b"\n")?;
                out.flush()?;
                Ok(())
            };
            loop {
                match rx.recv_timeout(Duration::from_millis(50)) {
                    Ok(s) => write(&s).with_context(|| format!("writing {}", path.display()))?,
                    Err(_) if stop.is_cancelled() => break,
                    Err(_) => {}
                }
            }
            while let Ok(s) = rx.try_recv() {
                write(&s).with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        })?;
    Ok(handle)
}

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
