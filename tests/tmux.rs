//! End to end: the real binary in a real terminal (tmux). Start it, press keys, read the screen,
//! quit, and check that the terminal came back and the run saved.

use std::process::Command;
use std::time::{Duration, Instant};

/// A detached tmux session running a command, killed on drop (shared with tests/reliability.rs).
pub(crate) struct Session(pub(crate) String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .status();
    }
}

pub(crate) fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux")
        .args(args)
        .output()
        .expect("tmux runs (make test installs it)");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

impl Session {
    /// Runs `cmd` in a new detached 100x30 tmux session.
    fn start(name: String, cmd: &str) -> Session {
        Session::start_sized(name, (100, 30), cmd)
    }

    /// Runs `cmd` in a new detached tmux session of `size` columns x rows. Tried again when the
    /// session is not there after: tmux's server exits with its last session (another test's
    /// ending), and a session asked of a server that is exiting is lost.
    pub(crate) fn start_sized(name: String, size: (u16, u16), cmd: &str) -> Session {
        let (x, y) = (size.0.to_string(), size.1.to_string());
        for _ in 0..5 {
            tmux(&["new-session", "-d", "-s", &name, "-x", &x, "-y", &y, cmd]);
            let there = Command::new("tmux")
                .args(["has-session", "-t", &name])
                .status()
                .is_ok_and(|s| s.success());
            if there {
                return Session(name);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("tmux never started the session {name}");
    }

    pub(crate) fn screen(&self) -> String {
        tmux(&["capture-pane", "-p", "-t", &self.0])
    }

    /// Waits until the screen satisfies `ok`; the limit only bounds a hung run.
    pub(crate) fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "never saw {what}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A tmux format about the pane, e.g. `#{alternate_on}`.
    pub(crate) fn display(&self, what: &str) -> String {
        tmux(&["display", "-p", "-t", &self.0, what])
            .trim()
            .to_string()
    }

    pub(crate) fn keys(&self, k: &str) {
        tmux(&["send-keys", "-t", &self.0, k]);
    }
}

#[test]
fn keys_work_in_a_real_terminal_and_quit_restores_it() {
    let save = tempfile::tempdir().unwrap();
    let name = format!("dflash-e2e-{}", std::process::id());
    let cmd = format!(
        "{} train --save-dir {}; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        save.path().display()
    );
    let s = Session::start(name, &cmd);

    s.wait_for("training steps", |x| {
        x.lines()
            .next()
            .and_then(|l| l.split("step ").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
    });
    assert_eq!(
        s.display("#{alternate_on}"),
        "1",
        "TUI on the alternate screen"
    );

    s.keys("p");
    s.wait_for("the profiling badge off", |x| x.contains("PROF off"));
    s.keys("p");
    s.wait_for("the profiling badge on", |x| x.contains("PROF on"));
    s.keys("2");
    s.wait_for("the threads view", |x| {
        x.contains(" 2 threads ") && x.contains("drafter-0")
    });
    s.keys("?");
    s.wait_for("the help overlay", |x| {
        x.contains("keys") && x.contains("space  pause") && x.contains("? or esc closes")
    });
    // Esc closes the overlay and leaves the run going.
    s.keys("Escape");
    s.wait_for("the help overlay closed", |x| {
        !x.contains("? or esc closes") && x.contains("RUNNING")
    });
    s.keys("Escape");
    s.wait_for("esc with nothing open", |x| x.contains("nothing to close"));
    s.keys("Space");
    s.wait_for("the paused badge", |x| x.contains("PAUSED"));
    s.keys("Space");
    s.wait_for("running again", |x| x.contains("RUNNING"));
    s.keys("c");
    s.wait_for("a saved checkpoint", |x| x.contains("saved "));

    // Quitting a training run asks once.
    s.keys("q");
    s.wait_for("the question", |x| x.contains("q again to stop training"));
    assert!(
        !s.screen().contains("EXITED="),
        "one q does not stop training"
    );
    s.keys("q");
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
    assert!(
        !after.contains("PROF"),
        "the TUI is gone from the screen: {after}"
    );
    assert_eq!(s.display("#{alternate_on}"), "0", "alternate screen left");
    let mut saved: Vec<String> = std::fs::read_dir(save.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    saved.sort();
    let last_saved = saved.last().expect("quitting saved a checkpoint");
    // The summary says the step the run stopped (and saved) at, not the last one drawn.
    let step: u64 = after
        .split("summary: step=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a summary line: {after}"));
    assert_eq!(last_saved, &format!("step-{step:06}"), "{after}");
}

#[test]
fn a_panic_in_a_worker_thread_restores_the_terminal() {
    let name = format!("dflash-panic-{}", std::process::id());
    let cmd = format!(
        "DFLASH_TOP_FAULT=panic_at_start:drafter-0 {} train; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top")
    );
    let s = Session::start(name, &cmd);
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(!after.contains("EXITED=0"), "a panic is a failure: {after}");
    assert!(
        after.contains("injected panic in drafter-0"),
        "the panic message is readable: {after}"
    );
    assert!(after.contains("dflash-top: a thread panicked"), "{after}");
    assert_eq!(s.display("#{alternate_on}"), "0", "alternate screen left");
}

/// A model too large for its GPU, in the TUI: the build's panic is one sentence after the
/// terminal is back, no panic text, no "a thread panicked".
#[test]
fn a_model_too_large_in_the_tui_is_a_sentence_on_a_restored_terminal() {
    let name = format!("dflash-oom-{}", std::process::id());
    let cmd = format!(
        "DFLASH_TOP_FAULT=oom_at_build:drafter {} train; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top")
    );
    let s = Session::start(name, &cmd);
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=1"), "{after}");
    assert!(
        after.contains("dflash-top: building the drafter on cpu failed: CUDA out of memory"),
        "{after}"
    );
    for noise in ["panicked", "RUST_BACKTRACE"] {
        assert!(!after.contains(noise), "no `{noise}`: {after}");
    }
    assert_eq!(s.display("#{alternate_on}"), "0", "alternate screen left");
}

#[test]
fn a_recording_replays_in_the_tui() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.jsonl");
    let o = Command::new(env!("CARGO_BIN_EXE_dflash-top"))
        .args([
            "train",
            "--headless",
            "--steps",
            "10",
            "--record",
            rec.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    let name = format!("dflash-replay-{}", std::process::id());
    let cmd = format!(
        "cd {} && {} replay {}; echo EXITED=$?; sleep 600",
        dir.path().display(),
        env!("CARGO_BIN_EXE_dflash-top"),
        rec.display()
    );
    let s = Session::start(name, &cmd);
    s.wait_for("the replay badge, the last step and the end mark", |x| {
        x.contains("REPLAY") && x.contains("step 10 ") && x.contains("■ end of recording")
    });
    // `<` seeks back from the end: the summary goes, the replay plays on to its end again.
    s.keys("<");
    s.wait_for("the seek", |x| {
        x.contains("seeking to t=0:00") && !x.contains("■ end of recording")
    });
    s.wait_for("the end again", |x| x.contains("■ end of recording"));
    // The trace file is the durable effect of `e` (the note is covered in tests/tui.rs).
    s.keys("e");
    let start = std::time::Instant::now();
    let trace_written = || {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("dflash-top-trace-")
            })
    };
    while !trace_written() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "e wrote no trace; screen:\n{}",
            s.screen()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    s.keys("q");
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
    // At its end, the same summary line as a finished live run.
    assert!(after.contains("summary: step=10 "), "{after}");
    let traces: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("dflash-top-trace-")
        })
        .collect();
    assert_eq!(traces.len(), 1, "e wrote one trace file");
}

#[test]
fn the_timeline_shows_a_lane_per_thread_and_esc_on_help_keeps_the_run() {
    let name = format!("dflash-timeline-{}", std::process::id());
    let cmd = format!(
        "{} train; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top")
    );
    let s = Session::start_sized(name, (120, 36), &cmd);
    s.wait_for("the first steps", |x| {
        x.contains("step ") && !x.contains("step 0 ")
    });
    s.keys("6");
    // A lane is a row that starts with the thread's name and holds phase segments.
    let has_lane = |x: &str, thread: &str| {
        x.lines()
            .any(|l| l.starts_with(&format!("│{thread}")) && l.chars().any(|c| "█▒▌▐".contains(c)))
    };
    // Waited for as one frame: a capture may land while the terminal is still being redrawn
    // (the lanes at the top, the previous view's panels below).
    s.wait_for(
        "lanes of the loader, the target and the drafter, and the HS queue's strip",
        |x| {
            x.contains(" 6 timeline ")
                && has_lane(x, "loader")
                && has_lane(x, "target-0")
                && has_lane(x, "drafter-0")
                && x.contains("q hs")
        },
    );
    s.keys("?");
    s.wait_for("the help overlay", |x| x.contains("? or esc closes"));
    s.keys("Escape");
    s.wait_for("the timeline again, still running", |x| {
        !x.contains("? or esc closes") && x.contains("RUNNING") && has_lane(x, "drafter-0")
    });
    s.keys("C-c");
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
}

/// The shell command of a training run with the UI config `path`, which prints the exit status
/// and keeps the pane open.
fn train_with_ui_config(path: &std::path::Path) -> String {
    format!(
        "DFLASH_TOP_UI_CONFIG={} {} train; echo EXITED=$?; sleep 600",
        path.display(),
        env!("CARGO_BIN_EXE_dflash-top")
    )
}

#[test]
fn a_bad_ui_config_is_one_sentence_naming_the_file_and_leaves_the_terminal_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    for (file, text, says, fix) in [
        (
            "malformed.toml",
            "[keys\nquit = \"x\"\n",
            "line 1, column 6: unclosed table",
            "fix the file",
        ),
        (
            "key.toml",
            "[keys]\nquitt = \"x\"\n",
            "[keys] has no action 'quitt'",
            "the actions are quit, back,",
        ),
        (
            "colour.toml",
            "[colors]\nforward = \"blurple\"\n",
            "[colors] forward = 'blurple' is not a colour",
            "#rrggbb",
        ),
    ] {
        let path = dir.path().join(file);
        std::fs::write(&path, text).unwrap();
        let name = format!("dflash-uiconfig-{}-{file}", std::process::id()).replace('.', "-");
        let s = Session::start_sized(name, (120, 30), &train_with_ui_config(&path));
        s.wait_for("the process to exit", |x| x.contains("EXITED="));
        // The screen with wrapped lines joined: the message is one line.
        let after = tmux(&["capture-pane", "-p", "-J", "-t", &s.0]);
        let lines: Vec<&str> = after.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(
            lines.len(),
            2,
            "one line of error, then the status: {after}"
        );
        let msg = lines[0];
        assert!(
            msg.starts_with(&format!("dflash-top: {}: ", path.display())),
            "{msg}"
        );
        assert!(msg.contains(says) && msg.contains(fix), "{msg}");
        assert_eq!(lines[1], "EXITED=1", "{after}");
        assert_eq!(
            s.display("#{alternate_on} #{cursor_flag}"),
            "0 1",
            "main screen, cursor shown"
        );
    }
}

#[test]
fn the_light_theme_draws_its_own_colours_in_a_real_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ui.toml");
    std::fs::write(&path, "[colors]\ntheme = \"light\"\n").unwrap();
    let name = format!("dflash-light-{}", std::process::id());
    let s = Session::start_sized(name, (120, 36), &train_with_ui_config(&path));
    s.wait_for("the first steps", |x| {
        x.contains("step ") && !x.contains("step 0 ")
    });
    for view in ["1", "6"] {
        s.keys(view);
        s.wait_for("the view", |x| {
            x.contains(if view == "1" {
                " 1 overview "
            } else {
                " 6 timeline "
            })
        });
        let ansi = tmux(&["capture-pane", "-p", "-e", "-t", &s.0]);
        // Dim text in the light grey chosen for white backgrounds, not the dark theme's.
        assert!(ansi.contains("\x1b[38;5;242m"), "{view}: {ansi}");
        assert!(!ansi.contains("\x1b[90m"), "{view}: dark grey: {ansi}");
        // No yellow, light yellow or white (unreadable on white), as text or fill.
        for c in [";5;3m", ";5;11m", ";5;15m", "[33m", "[93m", "[97m"] {
            assert!(!ansi.contains(c), "{view}: {c} drawn: {ansi}");
        }
    }
    s.keys("C-c");
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
}

#[test]
fn a_run_that_ends_says_finished_and_prints_its_summary_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("save");
    let rec = dir.path().join("run.jsonl");
    let name = format!("dflash-finished-{}", std::process::id());
    let cmd = format!(
        "{} train --steps 5 --save-dir {} --record {}; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        save.display(),
        rec.display()
    );
    let s = Session::start_sized(name, (120, 36), &cmd);
    // The threads can be seen to exit before the hub has published the last steps: the end
    // moves to them when it does.
    let end = s.wait_for("the finished badge at the last step", |x| {
        x.contains(" FINISHED ") && x.contains("step 5 ")
    });
    assert!(end.contains("run finished"), "the summary panel: {end}");
    let checkpoint = format!("{}/step-", save.display());
    assert!(end.contains(&checkpoint), "the last checkpoint: {end}");
    assert!(!end.contains("RUNNING"), "{end}");
    assert!(!end.contains("stalled"), "{end}");
    assert!(!end.contains("working"), "every thread exited: {end}");
    // One q leaves a finished run; the same summary is on the shell after.
    s.keys("q");
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
    // Wrapped lines joined: the summary is longer than a row.
    let flat = tmux(&["capture-pane", "-p", "-J", "-t", &s.0]);
    assert!(
        flat.contains("summary: step=5 from_step=0 steps=5 "),
        "{after}"
    );
    assert!(flat.contains(&format!("checkpoint={checkpoint}")), "{flat}");
    assert!(
        flat.contains(&format!("recording={}", rec.display())),
        "{flat}"
    );
}

/// Keys typed while the run starts (before the screen is taken) are not echoed over the shell,
/// do not reach the screen, and are not left for the shell after exit.
#[test]
fn keys_typed_while_starting_never_reach_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let name = format!("dflash-early-{}", std::process::id());
    let cmd = format!(
        "DFLASH_TOP_FAULT=hold_start:{} {} train --steps 100000; echo EXITED=$?; \
         read -t 2 -n 64 LEFT; echo \"LEFT=[$LEFT]\"; sleep 600",
        go.display(),
        env!("CARGO_BIN_EXE_dflash-top"),
    );
    let s = Session::start(name, &cmd);
    let tty = s.display("#{pane_tty}");
    let stty = || {
        let o = Command::new("stty")
            .args(["-a", "-F", &tty])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    // The run is starting (held there until `go` exists): the echo is off, the line discipline
    // still cooked (the screen is not taken yet).
    crate::support::wait_until("the starting run to turn the echo off", || {
        let t = stty();
        t.contains(" -echo ") && t.contains(" icanon ")
    });
    // A `q` among them would arm the quit question, were it read.
    s.keys("xyq");
    std::fs::write(&go, "").unwrap();
    s.wait_for("the TUI", |x| x.contains("RUNNING"));
    s.keys("q");
    s.keys("q");
    let after = s.wait_for("the shell's read", |x| x.contains("LEFT=["));
    assert!(after.contains("EXITED=0"), "{after}");
    assert!(
        after.contains("LEFT=[]"),
        "keys left for the shell: {after}"
    );
    assert!(!after.contains("xyq"), "keys echoed: {after}");
    assert!(!stty().contains(" -echo "), "the echo is back");
}
