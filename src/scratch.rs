//! Paths that must not outlive the process: a checkpoint's temporary directory while it is built,
//! a pruned one while it is removed. They are held as [`Scratch`] while they exist, and a forced
//! exit (src/signals.rs) removes them. Their short steps that make something visible (creating
//! the scratch, renaming it into place) hold the exit off until they are done, so a second signal
//! finds either the old state or the new one, never a mix.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Paths that exist only while something is being written or removed.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn scratch_list() -> MutexGuard<'static, Vec<PathBuf>> {
    SCRATCH.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes a file or directory tree whose writer may still be adding files to it (it stops once
/// the directory is gone: its next create fails).
fn remove_all(p: &Path) {
    for _ in 0..100 {
        let r = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
        if r.is_ok() || !p.exists() {
            return;
        }
    }
}

/// A path that must not outlive the process: removed by a second signal's exit, forgotten when
/// dropped (whoever made it has placed or removed it by then).
#[must_use]
pub struct Scratch(PathBuf);

impl Scratch {
    /// Runs `create` (which makes `path`) with a forced exit held off, and holds `path` as scratch.
    pub fn create(
        path: &Path,
        create: impl FnOnce(&Path) -> std::io::Result<()>,
    ) -> std::io::Result<Scratch> {
        let mut list = scratch_list();
        create(path)?;
        list.push(path.to_path_buf());
        Ok(Scratch(path.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Runs `place` (which renames the scratch into place, or removes it) with a forced exit
    /// held off until it returns, then lets the path go.
    pub fn settle<T>(self, place: impl FnOnce(&Path) -> T) -> T {
        let mut list = scratch_list();
        let out = place(&self.0);
        list.retain(|p| *p != self.0);
        out
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        scratch_list().retain(|p| *p != self.0);
    }
}

/// Removes every path held as scratch and exits with `code`. The list stays locked until the
/// process is gone: no scratch is created or placed after this.
pub fn remove_all_and_exit(code: i32) -> ! {
    let scratch = scratch_list();
    for p in scratch.iter() {
        remove_all(p);
    }
    std::process::exit(code)
}
