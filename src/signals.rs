//! SIGINT, SIGTERM and SIGHUP in every mode (TUI, headless, bench, replay): the first asks for a
//! graceful stop, which every front-end loop polls (`requested`) and treats like `q` — the
//! pipeline stops, saves the last good step when --save-dir is set, the terminal is restored.
//! A second signal (250 ms or more after the first) exits at once, with the terminal restored.
//!
//! Exiting at once must not leave a checkpoint half written: files that are being built beside
//! their final place (a checkpoint's temporary directory) or taken away (a pruned one) are held as
//! [`Scratch`] while they exist, and the exit path removes them. Their short steps that make
//! something visible (creating the scratch, renaming it into place) hold the exit off until they
//! are done, so a second signal finds either the old state or the new one, never a mix.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

static SIGNALS: AtomicU32 = AtomicU32::new(0);
static INSTALL: Once = Once::new();

/// Signals this soon after the first count as the first.
const DEBOUNCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Exit status after a second signal: 128 + SIGINT, the shell's convention for an interrupt.
pub const FORCED_EXIT: i32 = 130;

/// Installs the handler (once per process; later calls do nothing). The handler runs on
/// ctrlc's own thread, not in signal context, so it may restore the terminal and print.
pub fn install() {
    INSTALL.call_once(|| {
        let first = std::sync::OnceLock::new();
        let r = ctrlc::set_handler(move || {
            // A hang-up delivers SIGHUP more than once (the kernel, then tmux or sshd): signals
            // within DEBOUNCE of the first are the same request, not a second one.
            let at = *first.get_or_init(std::time::Instant::now);
            if at.elapsed() < DEBOUNCE {
                SIGNALS.fetch_max(1, Ordering::SeqCst);
                return;
            }
            if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
                crate::tui::terminal::restore();
                // Not eprintln: after a hang-up stderr is gone, and a panic here would lose the exit.
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    b"dflash-top: second signal: exiting now, without saving\n",
                );
                // Held until the process is gone: no scratch is created or placed after this.
                let scratch = scratch_list();
                for p in scratch.iter() {
                    remove_all(p);
                }
                std::process::exit(FORCED_EXIT);
            }
        });
        if let Err(e) = r {
            eprintln!("dflash-top: note: cannot handle SIGINT/SIGTERM/SIGHUP ({e})");
        }
    });
}

/// Whether a stop was asked for by a signal.
pub fn requested() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

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
