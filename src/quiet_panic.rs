//! Panics that a caller reports itself, kept quiet: while `Quiet` is held on a thread, the panic
//! hook it chains prints nothing for that thread's panics and keeps where each happened (and its
//! backtrace, where RUST_BACKTRACE asks for one), and the TUI's hook leaves them alone
//! (src/engine/pipeline/caught.rs and the pipeline's crew turn them into errors).

use std::cell::{Cell, RefCell};
use std::sync::Once;

thread_local! {
    static QUIET: Cell<u32> = const { Cell::new(0) };
    /// Where the last quiet panic of this thread happened (`file:line`).
    static WHERE: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Whether a panic on this thread now is one its caller reports.
pub fn here() -> bool {
    QUIET.with(|q| q.get()) > 0
}

/// Where this thread's last quiet panic happened, taken.
pub fn take_place() -> Option<String> {
    WHERE.with(|w| w.borrow_mut().take())
}

/// This thread's panics quiet for the guard's life (the hook installed on first use, on top of
/// whatever hook is there).
pub struct Quiet(());

impl Quiet {
    pub fn new() -> Quiet {
        install_hook();
        QUIET.with(|q| q.set(q.get() + 1));
        Quiet(())
    }
}

impl Default for Quiet {
    fn default() -> Quiet {
        Quiet::new()
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(q.get() - 1));
    }
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if here() {
                // With RUST_BACKTRACE set, the backtrace the hook would have printed follows.
                let trace = std::backtrace::Backtrace::capture();
                let trace = match trace.status() {
                    std::backtrace::BacktraceStatus::Captured => format!("\n{trace}"),
                    _ => String::new(),
                };
                let place = info
                    .location()
                    .map(|l| format!("{}:{}{trace}", l.file(), l.line()));
                WHERE.with(|w| *w.borrow_mut() = place);
            } else {
                previous(info);
            }
        }));
    });
}
