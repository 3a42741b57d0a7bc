//! Terminal init and restore: raw mode + alternate screen on the way in; on the way out, on
//! every path: normal return (a guard), error, and a panic in any thread (a chained hook, which
//! also tells the UI loop to leave).

use crossterm::{cursor, event, execute, terminal};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;
use std::io::{stdout, Stdout};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, OnceLock};

static RAW: AtomicBool = AtomicBool::new(false);
/// Set by the panic hook: the UI loop leaves at its next turn.
pub static PANICKED: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

pub type Term = Terminal<CrosstermBackend<Stdout>>;

/// Drops what was typed and not read (keys pressed while the screen was being taken, or after
/// the UI stopped reading): the shell must not get them once we leave.
fn flush_input() {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        // SAFETY: tcflush on our own standard input; an error leaves the input as it was.
        unsafe { libc::tcflush(libc::STDIN_FILENO, libc::TCIFLUSH) };
    }
}

/// The terminal's settings before `hush_input` turned its echo off.
static ORIGINAL: Mutex<Option<libc::termios>> = Mutex::new(None);

/// Turns the terminal's echo off while the run starts (the model loads before the screen is
/// taken): keys typed then are not written over the shell, and `init` drops them. Signals
/// (ctrl-c) still work. The settings come back with `restore`, or when the guard drops on a path
/// that never took the screen.
pub fn hush_input() -> Hushed {
    use std::io::IsTerminal;
    if std::io::stdin().is_terminal() {
        // SAFETY: tcgetattr/tcsetattr on our own standard input with a termios we own.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut t) == 0 {
                let mut slot = ORIGINAL.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(t);
                t.c_lflag &= !libc::ECHO;
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t);
            }
        }
    }
    Hushed
}

/// Gives the echo back (see `hush_input`).
pub struct Hushed;

impl Drop for Hushed {
    fn drop(&mut self) {
        unhush();
    }
}

fn unhush() {
    if let Some(t) = ORIGINAL.lock().unwrap_or_else(|e| e.into_inner()).take() {
        // SAFETY: the settings read by hush_input, back on our standard input.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) };
    }
}

/// Leaves raw mode and the alternate screen if we entered them, and gives back the echo
/// `hush_input` took. Safe to call twice.
pub fn restore() {
    if RAW.swap(false, Ordering::SeqCst) {
        flush_input();
        let _ = terminal::disable_raw_mode();
        let _ = execute!(
            stdout(),
            event::DisableMouseCapture,
            terminal::LeaveAlternateScreen,
            cursor::Show
        );
    }
    unhush();
}

/// A panic message held back while the TUI owns the screen; printed once it is restored.
static HELD: Mutex<Option<String>> = Mutex::new(None);
static UI_THREAD: OnceLock<std::thread::ThreadId> = OnceLock::new();
/// Held while the TUI takes the screen (raw mode, then the alternate screen) and while another
/// thread's panic hook decides where its message goes and prints it: a message printed while
/// the screen is being taken would land on the alternate screen and be lost with it.
static TAKING: Mutex<()> = Mutex::new(());

/// Installs the chained panic hook. A panic on the UI thread, or while no TUI is up, restores
/// the terminal and reports as usual. A panic in another thread while the TUI is up is held
/// back and flags the UI loop, which leaves within a frame; the message is printed after the
/// terminal is restored (`take_held_panic`), so nothing draws over it. Idempotent.
pub fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic its caller reports as an error (the pipeline's build) is no panic of the run's.
            if crate::quiet_panic::here() {
                return previous(info);
            }
            PANICKED.store(true, Ordering::SeqCst);
            let on_ui = UI_THREAD.get() == Some(&std::thread::current().id());
            // Not on the UI thread, which may panic while it holds the lock itself.
            let _taking = (!on_ui).then(|| TAKING.lock().unwrap_or_else(|e| e.into_inner()));
            if RAW.load(Ordering::SeqCst) && !on_ui {
                let thread = std::thread::current()
                    .name()
                    .unwrap_or("unnamed")
                    .to_string();
                *HELD.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("thread '{thread}' {info}"));
                return;
            }
            restore();
            previous(info);
        }));
    });
}

/// The panic message held back while the TUI was up, if any.
pub fn take_held_panic() -> Option<String> {
    HELD.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// Restores the terminal when dropped (unless a panic hook already did).
pub struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            restore();
        }
    }
}

pub fn init() -> anyhow::Result<(Term, Guard)> {
    use std::io::IsTerminal;
    if !stdout().is_terminal() {
        anyhow::bail!("standard output is not a terminal: run in a terminal, or pass --headless");
    }
    install_panic_hook();
    // A second signal's immediate exit gives the terminal back too.
    crate::signals::on_forced_exit(restore);
    let _ = UI_THREAD.set(std::thread::current().id());
    // A worker's panic is either printed before the screen is taken or held until it is given
    // back, never printed onto the alternate screen while it is being taken.
    let taking = TAKING.lock().unwrap_or_else(|e| e.into_inner());
    terminal::enable_raw_mode()?;
    RAW.store(true, Ordering::SeqCst);
    // Keys typed while the run was starting (echoed by the shell's terminal) were not meant for
    // a screen that did not exist yet: a `q` among them must not quit, nor any reach the shell.
    flush_input();
    let guard = Guard;
    // The mouse selects and scrolls (shift-drag still selects text in most terminals).
    execute!(
        stdout(),
        terminal::EnterAlternateScreen,
        event::EnableMouseCapture,
        cursor::Hide
    )?;
    drop(taking);
    let term = Terminal::new(CrosstermBackend::new(stdout()))?;
    Ok((term, guard))
}
