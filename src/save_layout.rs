//! How a run's save directory is laid out: one `step-N` directory a checkpoint. The engine writes
//! and prunes them (src/engine/checkpoint/save_dir.rs, checkpoint.rs); a run's summary names the newest.

use std::path::{Path, PathBuf};

/// `step-N` checkpoints in `dir`, oldest first (by step number).
pub fn checkpoints_in(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_str()?
                .strip_prefix("step-")?
                .parse()
                .ok()?;
            e.path().is_dir().then(|| (n, e.path()))
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}
