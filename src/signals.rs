//! SIGINT, SIGTERM and SIGHUP in every mode (TUI, headless, bench, replay): the first asks for a
//! graceful stop, which every front-end loop polls (`requested`) and treats like `q` — the
//! pipeline stops, saves the last good step when --save-dir is set, the terminal is restored.
//! A second signal exits at once, with the terminal restored first.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;

static SIGNALS: AtomicU32 = AtomicU32::new(0);
static INSTALL: Once = Once::new();

/// Exit status after a second signal: 128 + SIGINT, the shell's convention for an interrupt.
pub const FORCED_EXIT: i32 = 130;

/// Installs the handler (once per process; later calls do nothing). The handler runs on
/// ctrlc's own thread, not in signal context, so it may restore the terminal and print.
pub fn install() {
    INSTALL.call_once(|| {
        let r = ctrlc::set_handler(|| {
            if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
                crate::tui::terminal::restore();
                eprintln!("dflash-top: second signal: exiting now, without saving");
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
