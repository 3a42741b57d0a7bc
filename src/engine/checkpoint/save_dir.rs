//! The checkpoint directory at the start of a run: tried for writing before any step is spent,
//! cleared of what a killed run left half made, and kept from overwriting another run's
//! checkpoints by accident; and the fix to print when a save fails, by the error's kind.

use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

/// The fix that fits a failed write, from the error's text (`what` holds the OS's message).
pub fn fix_for(what: &str) -> &'static str {
    let has = |s: &str| what.contains(s);
    if has("No space left") || has("Disk quota") || has("File too large") {
        "free space on that disk or choose another --save-dir"
    } else if has("Permission denied") || has("Read-only file system") {
        "make that directory writable or choose another --save-dir"
    } else if has("Too many open files") {
        "raise the open-file limit (`ulimit -n`) or close some viewers"
    } else {
        "check that disk or choose another --save-dir"
    }
}

use crate::save_layout::checkpoints_in;

/// The process id in a temporary name a save leaves (`.step-N.tmp-PID`, `.old-PID`, `.del-PID`).
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(".step-")?;
    [".tmp-", ".old-", ".del-"]
        .iter()
        .find_map(|tag| rest.split_once(tag))
        .and_then(|(_, pid)| pid.parse().ok())
}

/// Removes the temporary directories of saves whose process is gone; returns them.
pub fn remove_stale(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(temp_owner) else {
            continue;
        };
        if pid != std::process::id()
            && !crate::probe::alive(pid)
            && std::fs::remove_dir_all(e.path()).is_ok()
        {
            removed.push(e.path());
        }
    }
    removed
}

/// Readies `dir` for a run's checkpoints: creates it, writes and removes a probe file (a
/// read-only, full or missing disk is found now, not after `--save-every` steps), removes what a
/// killed run left half written, and refuses a directory that holds another run's checkpoints
/// unless the run resumes (`--resume`) or `overwrite` says so. Returns notes to print.
pub fn prepare(dir: &Path, resuming: bool, overwrite: bool) -> Result<Vec<String>> {
    let cannot =
        |what: String| anyhow::anyhow!("--save-dir {}: {what}; {}", dir.display(), fix_for(&what));
    std::fs::create_dir_all(dir).map_err(|e| cannot(format!("cannot create it ({e})")))?;
    let probe = dir.join(format!(".write-test-{}", std::process::id()));
    let written = std::fs::write(&probe, vec![0u8; 4096])
        .and_then(|()| std::fs::File::open(&probe)?.sync_all());
    let _ = std::fs::remove_file(&probe);
    written.map_err(|e| cannot(format!("cannot write in it ({e})")))?;
    let mut notes = Vec::new();
    let stale = remove_stale(dir);
    if !stale.is_empty() {
        notes.push(format!(
            "removed {} temporary director{} a killed run left in {}",
            stale.len(),
            if stale.len() == 1 { "y" } else { "ies" },
            dir.display()
        ));
    }
    let existing = checkpoints_in(dir).map_err(|e| cannot(format!("cannot list it ({e})")))?;
    if let (Some(last), false, false) = (existing.last(), resuming, overwrite) {
        bail!(
            "--save-dir {} already holds {} checkpoint(s) of another run (the last {}): resume \
             it with --resume {}, choose an empty --save-dir, or give --overwrite to replace \
             them as this run saves",
            dir.display(),
            existing.len(),
            last.display(),
            last.display()
        );
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_runs_checkpoints_are_refused_unless_resuming_or_overwriting() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("ck");
        assert!(prepare(&d, false, false).unwrap().is_empty());
        assert!(d.is_dir(), "created");
        std::fs::create_dir(d.join("step-000040")).unwrap();
        let e = prepare(&d, false, false).unwrap_err().to_string();
        for m in [
            "already holds 1 checkpoint",
            "step-000040",
            "--resume",
            "--overwrite",
        ] {
            assert!(e.contains(m), "no {m} in {e}");
        }
        prepare(&d, true, false).unwrap();
        prepare(&d, false, true).unwrap();
    }

    #[test]
    fn a_killed_runs_temporary_directories_are_removed_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // PID 0 is never a process; our own is alive.
        let dead = d.join(".step-000080.tmp-0");
        let mine = d.join(format!(".step-000081.tmp-{}", std::process::id()));
        let other = d.join(".unrelated.tmp-0");
        for p in [&dead, &mine, &other] {
            std::fs::create_dir(p).unwrap();
        }
        let notes = prepare(d, false, false).unwrap();
        assert!(
            notes[0].contains("removed 1 temporary directory"),
            "{notes:?}"
        );
        assert!(!dead.exists() && mine.exists() && other.exists());
    }

    #[test]
    fn an_unwritable_directory_is_found_at_start_with_the_fix_that_fits() {
        // A directory under a regular file cannot be created, even by root.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        let e = prepare(&file.join("ck"), false, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--save-dir") && e.contains("cannot create it"),
            "{e}"
        );
        assert!(
            e.contains("check that disk or choose another --save-dir"),
            "{e}"
        );
        assert_eq!(
            fix_for("(No space left on device)"),
            "free space on that disk or choose another --save-dir"
        );
        assert!(fix_for("Read-only file system").contains("writable"));
    }
}
