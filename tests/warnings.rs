//! Warnings as data: the TUI's count and view, the headless `warn=` fields; `--fail-if` gates and
//! the flight recorder on the real binary.

use super::tui::{controls, screen, starved_snapshot, LIVE};
use dflash_top::telemetry::warnings::{Rule, Severity, Warning};
use dflash_top::tui::app::App;
use dflash_top::tui::choices::View;
use dflash_top::tui::keys::Action;
use dflash_top::tui::theme::Theme;
use std::sync::Arc;

fn warned() -> dflash_top::telemetry::Snapshot {
    let mut s = starved_snapshot();
    s.warnings = vec![
        Warning {
            rule: Rule::Stalled,
            subject: "target-0".into(),
            severity: Severity::Error,
            evidence: "no step has ended: target-0 in forward for 12.0 s".into(),
            fix: "see where target-0 hangs".into(),
            for_s: 2.0,
        },
        Warning {
            rule: Rule::Starved,
            subject: "drafter".into(),
            severity: Severity::Warn,
            evidence: "drafters wait on empty queue `hs` 92% of the time (depth 0/2)".into(),
            fix: "the target side is the bottleneck".into(),
            for_s: 14.0,
        },
    ];
    s
}

#[test]
fn the_header_counts_warnings_by_severity_and_view_7_lists_them() {
    let (ctl, _t) = controls(false);
    let mut app = App::new();
    app.on_snapshot(Arc::new(warned()));
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    assert!(s.contains("⚠ 1 error 1 warn (7)"), "{s}");
    app.update(Action::ShowView(6), &ctl);
    assert_eq!(app.view, View::Warnings);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    for m in [
        "warnings: 1 error · 1 warn · 0 info",
        "ERROR stalled:target-0",
        "WARN  starved:drafter",
        "`hs` 92% of the time",
        "fix: the target side is the bottleneck",
    ] {
        assert!(s.contains(m), "no {m} in\n{s}");
    }
    // Errors come first.
    assert!(s.find("stalled:target-0") < s.find("starved:drafter"));
    // On a narrow screen a long fix hangs under its `fix:`, every word kept.
    let mut narrow = warned();
    narrow.warnings[1].fix = "the target side is the bottleneck: more target workers, or a \
                              smaller target batch per worker, or a faster target device or \
                              placement"
        .into();
    let mut app = App::new();
    app.on_snapshot(Arc::new(narrow));
    app.update(Action::ShowView(6), &ctl);
    let s = screen(&app, 80, 30, Theme::from_color(false), LIVE);
    let rows: Vec<&str> = s.lines().collect();
    let at = rows
        .iter()
        .position(|r| r.contains("fix: the target side"))
        .unwrap();
    let next = rows[at + 1].trim_start_matches('│');
    assert!(
        next.starts_with("           ") && !next.trim_start().is_empty(),
        "{s}"
    );
    let words: String = rows[at..at + 3].join(" ");
    assert!(
        words.contains("target device or") && words.contains("placement"),
        "{s}"
    );
    // None in force: no count, and the view says every rule is quiet.
    let mut app = App::new();
    app.on_snapshot(Arc::new(starved_snapshot()));
    app.update(Action::ShowView(6), &ctl);
    let s = screen(&app, 120, 30, Theme::from_color(false), LIVE);
    assert!(!s.contains('⚠'), "{s}");
    assert!(s.contains("no warning in force"), "{s}");
}

#[test]
fn headless_lines_list_warnings_as_rule_subject_with_counts() {
    let line = dflash_top::headless::interval_line(&warned());
    assert!(
        line.contains(
            " warn=stalled:target-0,starved:drafter warn.error=1 warn.warn=1 warn.info=0"
        ),
        "{line}"
    );
    let quiet = dflash_top::headless::interval_line(&starved_snapshot());
    assert!(!quiet.contains("warn="), "{quiet}");
}

use super::runs::assert_user_error;
use super::support::{bin, run, stderr, stdout, train};
use std::process::Stdio;

/// The `fail-if:` line of a run's output.
fn reason(o: &std::process::Output) -> String {
    let out = stdout(o);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("fail-if:")).collect();
    assert_eq!(lines.len(), 1, "one reason line: {out}\n{}", stderr(o));
    lines[0].to_string()
}

#[test]
fn fail_if_tok_s_stops_the_run_saves_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let o = train(&[
        "--save-dir",
        save.to_str().unwrap(),
        "--fail-if",
        "tok/s<1e12 after 2s",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let why = reason(&o);
    assert!(why.contains("`tok/s<1e12 after 2s` held at t="), "{why}");
    // Stopped as on a normal stop: the summary, and the step it reached saved.
    let out = stdout(&o);
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert!(summary.contains("checkpoint="), "{summary}");
    let saved: Vec<_> = std::fs::read_dir(&save)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("step-"))
        .collect();
    assert_eq!(saved.len(), 1, "one checkpoint saved on the way out");
}

#[test]
fn gates_that_never_hold_let_the_run_finish_with_success() {
    // `gpu_idle` has no number on the CPU: that gate stays silent; tok/s is never negative.
    let o = train(&[
        "--steps",
        "6",
        "--fail-if",
        "gpu_idle>20% after 1s",
        "--fail-if",
        "tok/s<0",
        "--fail-if",
        "verdict=stalled for 30s",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stdout(&o).contains("fail-if:"));
}

#[test]
fn fail_if_verdict_stalled_on_a_hung_target() {
    // The target's first step takes 60 s: the pipeline stalls once it has worked 30 s in it
    // (src/telemetry/stall.rs, FIRST_STEP_NS).
    let o = train(&[
        "--slow",
        "target=60s",
        "--fail-if",
        "verdict=stalled for 1s",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let why = reason(&o);
    assert!(
        why.contains("verdict=stalled (target-0 in forward for"),
        "{why}"
    );
}

#[test]
fn fail_if_warn_at_error_on_a_hung_target() {
    let o = train(&["--slow", "target=60s", "--fail-if", "warn>=error"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let why = reason(&o);
    assert!(why.contains("warnings: stalled:target-0"), "{why}");
}

#[test]
fn a_bad_gate_is_one_sentence_with_the_forms() {
    for e in [
        "tok/s=3",
        "speed<3",
        "verdict=sleepy",
        "warn>=fatal",
        "loss<1 after soon",
    ] {
        let o = train(&["--steps", "1", "--fail-if", e]);
        assert_user_error(&o, &[&format!("--fail-if `{e}`"), "tok/s<12000 after 60s"]);
        assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
        let o = run(&["attach", "--headless", "--fail-if", e]);
        assert_user_error(&o, &[&format!("--fail-if `{e}`")]);
    }
    // A gate with the TUI: refused, naming --headless.
    let o = run(&["train", "--fail-if", "tok/s<1"]);
    assert_user_error(&o, &["--fail-if", "--headless"]);
}

#[test]
fn attach_headless_fail_if_detaches_with_status_3_and_the_run_goes_on() {
    let runtime = tempfile::tempdir().unwrap();
    let mut train = bin()
        .args(["train", "--headless", "--interval", "60"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    crate::support::served_socket("the run's socket", runtime.path(), train.id());
    let o = bin()
        .args(["attach", "--headless", "--fail-if", "tok/s<1e12 after 1s"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(reason(&o).contains("tok/s<1e12 after 1s"));
    assert!(
        train.try_wait().unwrap().is_none(),
        "the watched run goes on"
    );
    train.kill().unwrap();
    train.wait().unwrap();
}

/// The `flight:` lines of a run's output: (recording, trace).
fn dumps(o: &std::process::Output) -> Vec<(std::path::PathBuf, Option<std::path::PathBuf>)> {
    stdout(o)
        .lines()
        .filter_map(|l| l.strip_prefix("flight: "))
        .map(|l| {
            let (paths, _why) = l.split_once(": ").unwrap();
            match paths.split_once(" (trace ") {
                Some((rec, trace)) => (rec.into(), Some(trace.trim_end_matches(')').into())),
                None => (paths.into(), None),
            }
        })
        .collect()
}

#[test]
fn a_stall_is_dumped_beside_the_save_dir_and_the_dump_replays() {
    use dflash_top::telemetry::verdict::Verdict;
    use dflash_top::wire::recording::{read, Recording};
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    // The target's first step takes 60 s: the pipeline stalls once it has worked 30 s in it;
    // the gate ends the run a second into the stall.
    let o = train(&[
        "--slow",
        "target=60s",
        "--save-dir",
        save.to_str().unwrap(),
        "--fail-if",
        "verdict=stalled for 1s",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let found = dumps(&o);
    // The stall dumped; the gate a second later did not dump again (one a minute).
    assert_eq!(found.len(), 1, "{}", stdout(&o));
    let (rec, trace) = &found[0];
    assert!(rec.starts_with(save.join("flight")), "{}", rec.display());
    let line = stdout(&o);
    assert!(
        line.contains(": verdict stalled: target-0 in forward")
            || line.contains(": stalled:target-0"),
        "{line}"
    );
    let Recording::Snapshots(snaps) = read(rec).unwrap() else {
        panic!("a dump is one snapshot a line");
    };
    assert!(
        snaps.len() >= 50,
        "the seconds before the stall: {}",
        snaps.len()
    );
    assert_eq!(snaps.last().unwrap().verdict, Verdict::Stalled);
    assert!(snaps.windows(2).all(|w| w[0].seq < w[1].seq));
    // The loader's steps before the stall are in its trace.
    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(trace.as_ref().unwrap()).unwrap()).unwrap();
    assert!(trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["args"]["name"] == "loader"));
    // `replay` plays it in a real terminal to its end (the stall is its last snapshot).
    let cmd = format!(
        "{} replay {}; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        rec.display()
    );
    let tui = crate::tmux::Session::start_sized(
        format!("dflash-flight-{}", std::process::id()),
        (120, 30),
        &cmd,
    );
    let screen = tui.wait_for("the dump replayed to its end", |x| {
        x.contains("REPLAY") && x.contains("end of recording")
    });
    for m in ["target-0", "forward", "hs_wait", "drafters starve"] {
        assert!(screen.contains(m), "no {m} in\n{screen}");
    }
}

#[test]
fn flight_off_writes_nothing_and_a_gate_dumps_where_flight_says() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().join("ckpt");
    let flight = dir.path().join("dumps");
    let o = train(&[
        "--save-dir",
        save.to_str().unwrap(),
        "--flight",
        flight.to_str().unwrap(),
        "--fail-if",
        "tok/s<1e12 after 1s",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let found = dumps(&o);
    assert_eq!(found.len(), 1, "the gate dumped: {}", stdout(&o));
    assert!(found[0].0.starts_with(&flight));
    assert!(!save.join("flight").exists());
    let o = train(&[
        "--save-dir",
        dir.path().join("ckpt2").to_str().unwrap(),
        "--flight",
        "off",
        "--fail-if",
        "tok/s<1e12 after 1s",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(dumps(&o).is_empty(), "{}", stdout(&o));
    assert!(!dir.path().join("ckpt2").join("flight").exists());
}

#[test]
fn bench_refuses_the_gates_and_the_flight_recorder_with_a_sentence() {
    for extra in [["--fail-if", "tok/s<1"], ["--flight", "/tmp/x"]] {
        let o = run(&[&["bench", "engine"][..], &extra[..]].concat());
        assert_user_error(&o, &[extra[0], "not bench"]);
    }
}

#[test]
fn attach_takes_its_warning_rules_from_config_and_refuses_a_bad_table() {
    let runtime = tempfile::tempdir().unwrap();
    let toml = runtime.path().join("viewer.toml");
    // Any phase mark is over a zero budget, and that is an error here.
    std::fs::write(
        &toml,
        "[warnings]\nprofiling_budget_pct = 0.0\nprofiling_s = 0\n\
         [warnings.severity]\nprofiling_cost = \"error\"\n",
    )
    .unwrap();
    let mut train = bin()
        .args(["train", "--headless", "--interval", "60"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    crate::support::served_socket("the run's socket", runtime.path(), train.id());
    let attach = |config: &std::path::Path| {
        bin()
            .args(["attach", "--headless", "--fail-if", "warn>=error"])
            .arg("--config")
            .arg(config)
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap()
    };
    let o = attach(&toml);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        reason(&o).contains("warnings: profiling_cost:"),
        "{}",
        reason(&o)
    );
    std::fs::write(&toml, "[warnings]\nprofiling_budget = 1\n").unwrap();
    let o = attach(&toml);
    assert_user_error(&o, &["viewer.toml", "unknown field `profiling_budget`"]);
    // The viewer's verdict dwell comes from the same file, checked as train checks it.
    std::fs::write(&toml, "verdict_dwell = 900\n").unwrap();
    let o = attach(&toml);
    assert_user_error(&o, &["--config", "viewer.toml", "`verdict_dwell` 900"]);
    train.kill().unwrap();
    train.wait().unwrap();
}

/// Issue 28: `attach --flight DIR` keeps the last minute in the viewer: a headless attach to a
/// run whose target takes 5 s a step, with a gate that holds after 8 s, writes the dump into DIR
/// (the watched run, `--flight off`, writes none) holding the steps it saw, and `replay` plays
/// the dump to its end.
#[test]
fn attach_flight_dumps_what_the_viewer_saw_and_the_dump_replays() {
    use dflash_top::wire::recording::{read, Recording};
    let runtime = tempfile::tempdir().unwrap();
    let flight = runtime.path().join("viewer-dumps");
    let mut train = bin()
        .args(["train", "--headless", "--slow", "target=5s"])
        .args(["--interval", "60", "--flight", "off"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    crate::support::served_socket("the run's socket", runtime.path(), train.id());
    let o = bin()
        .args(["attach", "--headless", "--seconds", "40", "--interval", "5"])
        .args(["--flight", flight.to_str().unwrap()])
        .args(["--fail-if", "tok/s<1e12 after 8s"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    train.kill().unwrap();
    train.wait().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let found = dumps(&o);
    assert_eq!(found.len(), 1, "{}", stdout(&o));
    let (rec, trace) = &found[0];
    assert!(rec.starts_with(&flight), "{}", rec.display());
    assert!(
        stdout(&o).contains(".json): fail-if: `tok/s<1e12 after 8s` held"),
        "{}",
        stdout(&o)
    );
    assert!(trace.as_ref().is_some_and(|t| t.exists()));
    let Recording::Snapshots(snaps) = read(rec).unwrap() else {
        panic!("a dump is one snapshot a line");
    };
    assert!(snaps.len() >= 50, "the seconds before: {}", snaps.len());
    let target_steps = |s: &dflash_top::telemetry::Snapshot| {
        s.threads
            .iter()
            .find(|t| t.name == "target-0")
            .map_or(0, |t| t.run.steps)
    };
    assert!(
        target_steps(snaps.last().unwrap()) >= 1,
        "the target's 5 s steps the viewer saw"
    );
    let cmd = format!(
        "{} replay {}; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        rec.display()
    );
    let tui = crate::tmux::Session::start_sized(
        format!("dflash-attach-flight-{}", std::process::id()),
        (120, 30),
        &cmd,
    );
    let screen = tui.wait_for("the viewer's dump replayed to its end", |x| {
        x.contains("REPLAY") && x.contains("end of recording")
    });
    assert!(screen.contains("target-0"), "{screen}");
}

/// Issue 28: in the TUI the dump's path shows on the status line (the same `flight:` line the
/// headless run prints), and the file is there.
#[test]
fn the_tui_shows_where_a_stall_was_dumped() {
    let dir = tempfile::tempdir().unwrap();
    let flight = dir.path().join("d");
    let cmd = format!(
        "{} train --slow target=60s --flight {}; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        flight.display()
    );
    let tui = crate::tmux::Session::start_sized(
        format!("dflash-tui-flight-{}", std::process::id()),
        (240, 40),
        &cmd,
    );
    let screen = tui.wait_for("the dump's path on screen", |x| x.contains("flight: "));
    let line = screen
        .lines()
        .find_map(|l| Some(&l[l.find("flight: ")?..]))
        .unwrap();
    let path = line
        .strip_prefix("flight: ")
        .and_then(|l| l.split_whitespace().next())
        .unwrap();
    assert!(
        path.starts_with(flight.to_str().unwrap()) && path.ends_with(".jsonl"),
        "{line}"
    );
    assert!(std::path::Path::new(path).exists(), "{line}");
    tui.keys("q");
}

/// The seeded switches of the GPU check below, on the CPU: `item_in_loss` adds 4 counted reads
/// to each drafter step's `loss` phase (beside the one of `metrics`), and `vary_shapes` packs
/// fewer tokens than whole rows, which `shapes_vary` names (and a plain run's packed rows do
/// not raise).
#[test]
fn the_seeded_switches_add_reads_in_loss_and_vary_the_batch_length() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("now.toml");
    std::fs::write(&toml, "[warnings]\nshapes_s = 0\n").unwrap();
    // 40 steps, the shapes rule's hold off, under the faults given.
    let train = |faults: &str| {
        bin()
            .args(["train", "--headless", "--steps", "40", "--interval", "0.2"])
            .arg("--config")
            .arg(&toml)
            .env("DFLASH_TOP_FAULT", faults)
            .output()
            .unwrap()
    };
    let o = train("item_in_loss,vary_shapes");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let drafter = |l: &str| {
        l.split(" | ")
            .find(|f| f.starts_with("drafter-0"))
            .map(String::from)
    };
    let counted: Vec<String> = out.lines().filter_map(drafter).collect();
    assert!(
        counted
            .iter()
            .any(|d| d.contains("loss_syncs=4.0") && d.contains("metrics_syncs=1.0")),
        "{counted:?}"
    );
    // 40 steps of 2 rows of 256 tokens would be 20480.
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    let tokens = super::support::field(summary, "tokens").unwrap();
    assert!((10240.0..20480.0).contains(&tokens), "{summary}");
    // About the drafters, the stage whose steps carry the tokens; the loader's and the
    // target's steps vary as much but are not judged.
    assert!(out.contains("warn=shapes_vary:drafter"), "{out}");
    assert!(!out.contains("shapes_vary:loader") && !out.contains("shapes_vary:target"));
    let plain = train("");
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    assert!(
        !stdout(&plain).contains("shapes_vary"),
        "{}",
        stdout(&plain)
    );
}

/// The `t=` of a headless interval line, seconds.
pub fn elapsed_s(line: &str) -> Option<f64> {
    line.strip_prefix("t=")?.split_once("s ")?.0.parse().ok()
}

/// Issue 28's seeded checks, on a GPU, with the rules' windows set short in the TOML (their
/// defaults hold 10 s against noise): a drafter step that reads its loss back 4 times
/// (`item_in_loss`), a drafter that empties libtorch's cache every step (`empty_cache`: the
/// allocator back to the device every step) and batch shapes that vary every step
/// (`vary_shapes`: `shapes_vary`) each raise their warning within 2 s of the first step. A
/// drafter that sleeps half a second a step with hidden states queued for it raises `gpu_idle`
/// once its window (2 s) is covered after the warm-up steps of every worker on the GPU (5 of
/// its 0.55 s steps): 4.5 to 4.8 s on an H200, asked within 6 s. A plain run raises none of
/// them in 12 s.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn seeded_host_syncs_an_idle_gpu_and_varying_shapes_warn_on_cuda() {
    if crate::cuda_or_skip("the seeded GPU warnings").is_none() {
        return;
    }
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("short.toml");
    std::fs::write(
        &toml,
        "[warnings]\nhost_sync_s = 1\nalloc_window_s = 1\ngpu_idle_s = 2\nshapes_s = 0\n",
    )
    .unwrap();
    let keys = [
        "host_sync:drafter-0",
        "alloc_churn:cuda:0",
        "gpu_idle:cuda:0",
        "shapes_vary:drafter",
    ];
    // (fault, extra flags, the warning it must raise and within how long of the first step, the
    // warnings it must not raise in 12 s).
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        Option<(&'a str, f64)>,
        &'a [&'a str],
    );
    let cases: [Case; 5] = [
        ("item_in_loss", &[], Some((keys[0], 2.0)), &[]),
        ("", &["--slow", "drafter=500ms"], Some((keys[2], 6.0)), &[]),
        ("empty_cache", &[], Some((keys[1], 2.0)), &[]),
        ("vary_shapes", &[], Some((keys[3], 2.0)), &[]),
        ("", &[], None, &keys),
    ];
    let mut failed = Vec::new();
    for (fault, extra, want, banned) in cases {
        let mut child = bin()
            .args(["train", "--headless", "--preset", "qwen3-0.6b"])
            .args(["--target-devices", "cuda:0", "--drafter-devices", "cuda:0"])
            .args(["--interval", "0.25", "--steps", "100000", "--config"])
            .arg(&toml)
            .args(extra)
            .env("DFLASH_TOP_FAULT", fault)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut first_step, mut raised, mut others) = (None, None, Vec::new());
        for line in lines.map_while(Result::ok) {
            let (Some(t), Some(step)) = (elapsed_s(&line), super::support::field(&line, "step"))
            else {
                continue;
            };
            if step >= 1.0 && first_step.is_none() {
                first_step = Some(t);
            }
            let Some(t0) = first_step else { continue };
            let shown: Vec<&str> = keys.iter().copied().filter(|k| line.contains(k)).collect();
            others.extend(
                shown
                    .iter()
                    .filter(|k| banned.contains(k))
                    .map(|k| format!("{k} at {:.2} s", t - t0)),
            );
            if want.is_some_and(|(w, _)| shown.contains(&w)) {
                raised = Some(t - t0);
                break;
            }
            if t - t0 > want.map_or(12.0, |(_, limit)| limit + 1.0) {
                break;
            }
        }
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        let _ = child.wait();
        let case = format!("{fault:?} {extra:?}");
        if !others.is_empty() {
            failed.push(format!("{case} raised {others:?}"));
        }
        match (want, raised) {
            (Some((w, limit)), Some(after)) => {
                eprintln!("{case}: {w} {after:.2} s after the first step");
                if after > limit {
                    failed.push(format!(
                        "{case}: {w} only {after:.2} s after the first step"
                    ));
                }
            }
            (Some((w, _)), None) => failed.push(format!("{case}: no {w}")),
            (None, _) => eprintln!("{case}: none of {banned:?} in 12 s"),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
