//! SIGINT, SIGTERM and SIGHUP in every mode (TUI, headless, bench, replay): the first asks for a
//! graceful stop, which every front-end loop polls (`requested`) and treats like `q` — the
//! pipeline stops, saves the last good step when --save-dir is set, the terminal is restored.
//! A second signal (250 ms or more after the first) exits at once, with the terminal restored.
//!
//! A reader that goes away (`train --headless | head`) is a first signal too: Rust ignores
//! SIGPIPE, so a line written to a closed pipe fails instead, and `print_line` asks for the
//! graceful stop then (println! would panic there) and prints nothing more.
//!
//! Exiting at once must not leave a checkpoint half written: the exit removes what is held as
//! scratch (src/scratch.rs). Nor a terminal in raw mode: the screen registers its restore as the
//! exit hook (`on_forced_exit`), so that nothing here knows the screen.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};

static SIGNALS: AtomicU32 = AtomicU32::new(0);
static INSTALL: Once = Once::new();
/// What a forced exit runs first (the terminal's restore, registered by the screen).
static EXIT_HOOK: OnceLock<fn()> = OnceLock::new();

/// Registers `hook` to run before a second signal's exit (the first registration holds).
pub fn on_forced_exit(hook: fn()) {
    let _ = EXIT_HOOK.set(hook);
}

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
                if let Some(hook) = EXIT_HOOK.get() {
                    hook();
                }
                // Not eprintln: after a hang-up stderr is gone, and a panic here would lose the exit.
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    b"dflash-top: second signal: exiting now, without saving\n",
                );
                crate::scratch::remove_all_and_exit(FORCED_EXIT);
            }
        });
        if let Err(e) = r {
            eprintln!("dflash-top: note: cannot handle SIGINT/SIGTERM/SIGHUP ({e})");
        }
    });
}

/// Exits at once, as a second signal does (terminal restored, scratch removed), after writing
/// `message` to stderr: for a run that cannot end by itself (a worker held in a collective by a
/// rank that is gone).
pub fn exit_now(code: i32, message: &str) -> ! {
    if let Some(hook) = EXIT_HOOK.get() {
        hook();
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{message}\n").as_bytes());
    crate::scratch::remove_all_and_exit(code);
}

/// Whether a stop was asked for by a signal.
pub fn requested() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// Set once stdout's reader is gone (or stdout failed otherwise).
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set when a write to stdout failed for another reason than a closed pipe (a full disk).
static STDOUT_FAILED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `line` and a newline to stdout while the run goes on. Where the reader is gone (a
/// closed pipe, found by this line or an earlier one) it asks for the graceful stop, as a first
/// signal does, and from then on writes nothing.
pub fn print_line(line: &str) {
    if write_line(line) || STDOUT_GONE.load(Ordering::SeqCst) {
        SIGNALS.fetch_max(1, Ordering::SeqCst);
    }
}

/// `print_line` for what a run prints after it ended (its summary): a reader gone then changes
/// nothing (the run is not said to have been stopped).
pub fn print_result_line(line: &str) {
    write_line(line);
}

/// `println!` for the lines a command prints as its result (bench's figures, replay's summary,
/// attach's list, export's report): through `print_result_line`, so that a reader that left
/// (`bench engine | head -1`) ends the output quietly where println! would panic.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::signals::print_result_line(&format!($($arg)*))
    };
}
pub(crate) use outln;

/// Whether a write to stdout failed for another reason than a closed pipe (said on stderr
/// then): the command's output is incomplete, and it exits non-zero (src/main.rs).
pub fn stdout_failed() -> bool {
    STDOUT_FAILED.load(Ordering::SeqCst)
}

/// Writes `line` unless stdout is gone; true when this write found it gone. A closed pipe is the
/// reader leaving; any other error (a full disk under `> file`) is said once on stderr.
fn write_line(line: &str) -> bool {
    use std::io::Write;
    if STDOUT_GONE.load(Ordering::SeqCst) {
        return false;
    }
    let mut out = std::io::stdout().lock();
    let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) else {
        return false;
    };
    STDOUT_GONE.store(true, Ordering::SeqCst);
    if e.kind() != std::io::ErrorKind::BrokenPipe {
        STDOUT_FAILED.store(true, Ordering::SeqCst);
        eprintln!("dflash-top: cannot write to stdout ({e}); nothing more is written there");
    }
    true
}
