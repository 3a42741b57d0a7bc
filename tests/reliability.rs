//! Issue 14, reliability: signals in every mode, checkpoints that survive faults, non-finite
//! steps, worker errors. The real binary throughout; faults come from the test-only
//! `DFLASH_TOP_FAULT` injection (documented where it is read).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::stderr;

/// `step-*` checkpoint directories under `dir`, sorted.
fn step_dirs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("step-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Entries of `dir` whose names start with a dot: temporary or half-removed checkpoints.
fn hidden(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// Reads the child's headless lines until one shows a step past 0 (training is under way), then
/// drains the rest in the background: a pipe nobody reads fills up (64 KiB, under a minute of lines at `--interval
/// 0.2`), and the run's writes then block.
fn wait_for_steps(child: &mut Child) {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the run ended before training"
        );
        let step = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("step="))
            .and_then(|v| v.parse::<u64>().ok());
        if step.is_some_and(|s| s > 0) {
            std::thread::Builder::new()
                .name("drain-stdout".into())
                .spawn(move || std::io::copy(&mut out, &mut std::io::sink()))
                .unwrap();
            return;
        }
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("the run did not stop after the signal");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn kill(child: &Child, sig: i32) {
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The binary with `args` and `--save-dir dir`, its output piped.
fn spawn_saving_in(args: &[&str], dir: &Path) -> Child {
    bin()
        .args(args)
        .arg("--save-dir")
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_signal_stops_a_headless_run_and_saves_the_last_step() {
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let args = ["train", "--headless", "--interval", "0.2"];
        let mut child = spawn_saving_in(&args, dir.path());
        wait_for_steps(&mut child);
        kill(&child, sig);
        let status = wait_exit(&mut child);
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(130), "signal {sig}: {err}");
        assert!(err.contains("stopped by a signal"), "signal {sig}: {err}");
        let saved = step_dirs(dir.path());
        assert_eq!(saved.len(), 1, "signal {sig}: one checkpoint: {saved:?}");
        let ck = dir.path().join(&saved[0]);
        for f in [
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
        ] {
            assert!(
                ck.join(f).is_file(),
                "signal {sig}: {f} in {}",
                ck.display()
            );
        }
    }
}

/// `train --headless | head`: once the reader of its lines is gone, the run stops as after a
/// signal (no panic on the closed pipe), saving its last step.
#[test]
fn a_headless_run_whose_reader_leaves_stops_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["train", "--headless", "--interval", "0.1"];
    let mut child = spawn_saving_in(&args, dir.path());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("step=") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "no interval line");
    }
    drop(out);
    let err = exits_quietly_with(&mut child, 130);
    assert_eq!(step_dirs(dir.path()).len(), 1, "the last step saved: {err}");
}

/// Waits for `child` and checks it exited with `code` and no panic or broken-pipe message on
/// stderr; gives back its stderr.
fn exits_quietly_with(child: &mut Child, code: i32) -> String {
    let status = wait_exit(child);
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(code), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
    err
}

/// Stopped by a signal at any step of a run of 3 steps a batch, the last save says how many of
/// its batch's steps were taken (none said at a batch's end), and the run resumes from it.
#[test]
fn a_signal_partway_through_a_batch_saves_the_steps_taken_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "train",
        "--headless",
        "--interval",
        "0.2",
        "--steps-per-batch",
        "3",
    ];
    let mut child = spawn_saving_in(&args, dir.path());
    wait_for_steps(&mut child);
    kill(&child, libc::SIGINT);
    assert_eq!(wait_exit(&mut child).code(), Some(130));
    let saved = step_dirs(dir.path());
    let ck = dir.path().join(&saved[0]);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("trainer_state.json")).unwrap())
            .unwrap();
    let step = state["step"].as_u64().unwrap();
    assert_eq!(
        state["batch_steps_done"].as_u64().unwrap_or(0),
        step % 3,
        "{state}"
    );
    let more = (step + 2).to_string();
    let o = bin()
        .args([
            "train",
            "--headless",
            "--interval",
            "30",
            "--steps",
            &more,
            "--resume",
        ])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn a_signal_stops_a_bench_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "bench",
        "engine",
        "--steps",
        "100000",
        "--save-every",
        "1",
        "--keep",
        "1",
    ];
    let mut child = spawn_saving_in(&args, dir.path());
    // The bench prints at its end only: a first periodic checkpoint shows it is training.
    let start = Instant::now();
    while step_dirs(dir.path()).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(90), "no step saved");
        std::thread::sleep(Duration::from_millis(50));
    }
    kill(&child, libc::SIGTERM);
    let status = wait_exit(&mut child);
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(
        out.contains("bench: preset="),
        "the bench reports what it measured: {out}"
    );
    assert_eq!(step_dirs(dir.path()).len(), 1, "{err}");
}

/// `bench engine | head -1`: a reader gone before the figures come ends them quietly (println!
/// panicked there, with a backtrace), and the bench exits as it would have.
#[test]
fn a_bench_whose_reader_left_ends_quietly() {
    let mut child = bin()
        .args(["bench", "engine", "--preset", "tiny", "--steps", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Closed before anything is written: every line meets a closed pipe.
    drop(child.stdout.take());
    exits_quietly_with(&mut child, 0);
}

/// `bench engine > file` on a full disk (/dev/full): the lost output is said on stderr, once,
/// and the exit is non-zero (println! panicked; a closed pipe alone exits 0).
#[test]
fn a_bench_whose_output_cannot_be_written_says_so_and_fails() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = bin()
        .args(["bench", "engine", "--preset", "tiny", "--steps", "2"])
        .stdout(full)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("cannot write to stdout").count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Waits until a save has begun in `dir` (its temporary directory is there), then past the
/// 250 ms in which further signals count as the first (a hang-up sends several).
fn wait_for_a_save_to_begin(dir: &Path) {
    let start = Instant::now();
    while !hidden(dir).iter().any(|n| n.contains(".tmp-")) {
        assert!(start.elapsed() < Duration::from_secs(60), "no save began");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(400));
}

#[test]
fn a_second_signal_during_the_final_save_exits_at_once_and_leaves_no_partial_checkpoint() {
    // An earlier checkpoint in the same directory, which must come through untouched.
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["train", "--headless", "--steps", "1", "--save-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let model = dir.path().join("step-000001/model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    // A save held open for 10 s (save_slow) keeps the graceful stop going when the second lands;
    // a new run into that directory says --overwrite.
    let mut child = bin()
        .args([
            "train",
            "--headless",
            "--overwrite",
            "--interval",
            "0.2",
            "--save-dir",
        ])
        .arg(dir.path())
        .env("DFLASH_TOP_FAULT", "save_slow")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_steps(&mut child);
    kill(&child, libc::SIGTERM);
    wait_for_a_save_to_begin(dir.path());
    kill(&child, libc::SIGINT);
    let status = wait_exit(&mut child);
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("second signal"), "{err}");
    let left = hidden(dir.path());
    assert!(left.is_empty(), "the abandoned save was removed: {left:?}");
    assert_eq!(step_dirs(dir.path()), ["step-000001"], "{err}");
    assert_eq!(
        std::fs::read(&model).unwrap(),
        bytes,
        "earlier checkpoint intact"
    );
}

fn run_with_fault(fault: &str, args: &[&str]) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let o = bin()
        .args(["train", "--headless", "--interval", "0.2", "--save-dir"])
        .arg(dir.path())
        .args(args)
        .env("DFLASH_TOP_FAULT", fault)
        .output()
        .unwrap();
    (o, dir)
}

#[test]
fn keep_leaves_the_newest_checkpoints() {
    let (o, dir) = run_with_fault("", &["--steps", "7", "--save-every", "1", "--keep", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        step_dirs(dir.path()),
        ["step-000005", "step-000006", "step-000007"]
    );
    let left = hidden(dir.path());
    assert!(left.is_empty(), "no temporary directories left: {left:?}");
}

#[test]
fn a_failed_save_names_the_directory_and_leaves_the_previous_checkpoint() {
    // A run of 4 steps stopped by an error after its second: step 2 is saved, the schedule is
    // still the 4-step one (a resume may not go past it).
    let (o, dir) = run_with_fault("error:drafter", &["--steps", "4"]);
    assert!(!o.status.success(), "{}", stderr(&o));
    let before = step_dirs(dir.path());
    assert_eq!(before, ["step-000002"]);
    let model = dir.path().join("step-000002/model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    let o = bin()
        .args(["train", "--headless", "--steps", "4", "--save-dir"])
        .arg(dir.path())
        .arg("--resume")
        .arg(dir.path().join("step-000002"))
        .env("DFLASH_TOP_FAULT", "save_write")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.starts_with("dflash-top: "), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("cannot save the checkpoint")
            && err.contains(&dir.path().join("step-000004").display().to_string())
            && err.contains("--save-dir"),
        "{err}"
    );
    assert_eq!(step_dirs(dir.path()), before, "{err}");
    assert_eq!(
        std::fs::read(&model).unwrap(),
        bytes,
        "previous checkpoint intact"
    );
    let left = hidden(dir.path());
    assert!(left.is_empty(), "the failed save cleaned up: {left:?}");
}

/// Resuming from a damaged checkpoint: a sentence naming the damaged file, no panic.
#[test]
fn a_damaged_checkpoint_is_refused_on_resume() {
    let (o, dir) = run_with_fault("", &["--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let good = dir.path().join("step-000001");
    type Damage = fn(&[u8]) -> Vec<u8>;
    let damages: [(&str, Damage); 6] = [
        ("model.safetensors", |b| b[..b.len() / 2].to_vec()),
        // One flipped bit in the weights: loadable, found by the checksum.
        ("model.safetensors", |b| {
            let mut b = b.to_vec();
            let at = b.len() - 64;
            b[at] ^= 0x04;
            b
        }),
        ("model.safetensors", |_| {
            b"garbage, not safetensors".to_vec()
        }),
        ("optimizer.safetensors", |b| b[..b.len() - 100].to_vec()),
        ("trainer_state.json", |_| b"{\"step\": ".to_vec()),
        ("config.json", |_| b"[1, 2".to_vec()),
    ];
    for (file, damage) in damages {
        let bad = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), bad.path().join(e.file_name())).unwrap();
        }
        let orig = std::fs::read(good.join(file)).unwrap();
        std::fs::write(bad.path().join(file), damage(&orig)).unwrap();
        let o = bin()
            .args(["train", "--headless", "--steps", "1", "--resume"])
            .arg(bad.path())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!o.status.success(), "{file}: {err}");
        assert!(err.starts_with("dflash-top: "), "{file}: {err}");
        assert!(!err.contains("panicked"), "{file}: {err}");
        assert!(
            err.contains(&bad.path().join(file).display().to_string()),
            "{file} named: {err}"
        );
        assert!(
            err.contains("again") || err.contains("earlier checkpoint"),
            "{file}: a fix: {err}"
        );
    }
}

/// Values read from a checkpoint are range-checked (the checksum file removed, as a checkpoint
/// of an earlier version has none): a sentence naming the file and field, never a panic or a
/// hang; and a flag or TOML value out of range is named too.
#[test]
fn out_of_range_values_in_checkpoints_and_settings_are_refused_by_name() {
    let (o, dir) = run_with_fault("", &["--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let good = dir.path().join("step-000001");
    let edit = |file: &str, change: &dyn Fn(&mut serde_json::Value)| {
        let bad = tempfile::tempdir().unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), bad.path().join(e.file_name())).unwrap();
        }
        std::fs::remove_file(bad.path().join("checksums.json")).unwrap();
        let path = bad.path().join(file);
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        change(&mut v);
        std::fs::write(&path, v.to_string()).unwrap();
        bad
    };
    let refused = |args: &[&str], dir: &Path, must: &[&str]| {
        let o = bin()
            .args(["train", "--headless", "--steps", "2"])
            .args(args)
            .arg(dir)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!o.status.success(), "{must:?}: {err}");
        assert!(
            err.starts_with("dflash-top: ") && !err.contains("panicked"),
            "{err}"
        );
        for m in must {
            assert!(err.contains(m), "no {m} in {err}");
        }
    };
    for flag in ["--resume", "--drafter"] {
        let bad = edit("config.json", &|v| {
            v["dflash_config"]["block_size"] = 0.into()
        });
        refused(&[flag], bad.path(), &["config.json", "`block_size` 0"]);
    }
    // A data position no run of that length reaches: refused at once, not re-made for hours.
    let bad = edit("trainer_state.json", &|v| {
        v["data_docs"] = 4_000_000_000_000u64.into()
    });
    refused(
        &["--resume"],
        bad.path(),
        &["trainer_state.json", "`data_docs`"],
    );
    let toml = dir.path().join("t.toml");
    std::fs::write(&toml, "threads_per_worker = 0\n").unwrap();
    refused(&["--config"], &toml, &["threads_per_worker"]);
    let o = bin()
        .args(["train", "--headless", "--steps", "-1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--steps"), "{}", stderr(&o));
}

/// A new run into a directory of another run's checkpoints is refused unless it resumes or
/// says --overwrite; what a killed run left half written there is removed at the next start.
#[test]
fn another_runs_save_dir_is_refused_and_a_killed_runs_leftovers_are_removed() {
    let (o, dir) = run_with_fault("", &["--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = bin()
        .args(["train", "--headless", "--steps", "1", "--save-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    for m in [
        "already holds 1 checkpoint",
        "step-000001",
        "--overwrite",
        "--resume",
    ] {
        assert!(err.contains(m), "no {m} in {err}");
    }
    // A save cut short by a kill (its process, pid 0, is gone).
    let leftover = dir.path().join(".step-000007.tmp-0");
    std::fs::create_dir(&leftover).unwrap();
    let o = bin()
        .args([
            "train",
            "--headless",
            "--steps",
            "2",
            "--overwrite",
            "--save-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("removed 1 temporary directory"),
        "{}",
        stderr(&o)
    );
    assert!(!leftover.exists());
    assert_eq!(step_dirs(dir.path()), ["step-000001", "step-000002"]);
}

#[test]
fn non_finite_steps_are_skipped_counted_and_stop_the_run_when_they_persist() {
    // Steps 3..=4 are NaN: skipped (the weights stay finite), counted, the run goes on.
    let (o, dir) = run_with_fault("nan:3-4", &["--steps", "6"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let last = out.lines().rfind(|l| l.starts_with("t=")).unwrap();
    assert!(last.contains("nonfinite=2"), "{last}");
    assert_eq!(step_dirs(dir.path()), ["step-000006"]);
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert!(!summary.contains("NaN"), "{summary}");

    // From step 3 on, every step is NaN: the run stops after --max-nonfinite 5, at step 2.
    let (o, dir) = run_with_fault("nan:3-", &["--steps", "50", "--max-nonfinite", "5"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("5 steps in a row had a non-finite loss") && err.contains("drafter-0"),
        "{err}"
    );
    assert_eq!(step_dirs(dir.path()), ["step-000002"], "{err}");
}

#[test]
fn a_failing_worker_stops_the_run_names_thread_and_phase_and_saves() {
    for (fault, thread, phase) in [
        ("panic:target", "target-0", "h2d"),
        ("error:drafter", "drafter-0", "forward"),
        ("error:loader", "loader", "read"),
    ] {
        let (o, dir) = run_with_fault(fault, &[]);
        let err = stderr(&o);
        assert!(!o.status.success(), "{fault}: {err}");
        assert!(
            err.contains(&format!("dflash-top: {thread} failed in phase `{phase}`")),
            "{fault}: {err}"
        );
        if fault.starts_with("panic:") {
            // Said once, in the sentence with where it happened: not by the panic hook too.
            assert!(err.contains("(at src/fault.rs:"), "{fault}: {err}");
            assert!(!err.contains("panicked at"), "{fault}: {err}");
        }
        if fault.starts_with("error:drafter") {
            // The drafter made two steps before it failed: the last good one is saved.
            assert_eq!(step_dirs(dir.path()), ["step-000002"], "{fault}: {err}");
        }
    }
    let (o, _dir) = run_with_fault("oom:drafter", &[]);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    for knob in [
        "out of memory",
        "batch",
        "anchors",
        "seq_len",
        "loss_chunk_mib",
        // what the shapes need (src/engine/pipeline.rs memory_note)
        "(by the shapes a target and a drafter together need about",
    ] {
        assert!(err.contains(knob), "oom names `{knob}`: {err}");
    }
}

#[test]
fn a_model_too_large_for_its_device_is_a_sentence_not_a_panic() {
    // tch panics on libtorch's errors; building the models on the main thread catches it.
    for role in ["target", "drafter"] {
        let (o, dir) = run_with_fault(&format!("oom_at_build:{role}"), &["--steps", "2"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{role}: {err}");
        assert!(
            err.contains(&format!("dflash-top: building the {role} on cpu failed: ")),
            "{role}: {err}"
        );
        assert!(
            err.contains("Tried to allocate 9.57 GiB") && err.contains("--target-devices"),
            "the error and the fix: {err}"
        );
        // The shapes' estimate (the tiny preset's: its loss chunk's 1 GiB; on a GPU, the card too);
        // no lever where none saves a rounded GiB.
        assert!(
            err.contains("(by the shapes a target and a drafter together need about 1 GiB)"),
            "what the shapes need: {err}"
        );
        for noise in ["panicked", "RUST_BACKTRACE", "frame #0", "Exception raised"] {
            assert!(!err.contains(noise), "{role}: no `{noise}` in {err}");
        }
        assert!(step_dirs(dir.path()).is_empty(), "nothing was trained");
    }
}

/// A preset whose weights alone are more than the host's memory, on the CPU: a sentence with the
/// fix before anything is built (the kernel's out-of-memory killer ended it mid-build before).
#[test]
fn a_preset_larger_than_the_hosts_memory_is_refused_before_it_is_built() {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| -> f64 {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let kib = kib("MemAvailable:") + kib("SwapFree:");
    // Qwen3-32B's weights in f32 on the CPU are 156.7 GiB.
    if kib / (1u64 << 20) as f64 > 150.0 {
        eprintln!("skipped: this host has room for qwen3-32b's weights");
        return;
    }
    let start = Instant::now();
    let o = crate::support::bin()
        .args(["bench", "engine", "--preset", "qwen3-32b", "--steps", "1"])
        .args(["--target-devices", "cpu", "--drafter-devices", "cpu"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(
            "dflash-top: --preset qwen3-32b with the target and the drafter on the CPU needs at \
             least 156.7 GiB"
        ) && err.contains("train it on GPUs (--target-devices cuda:0"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "refused before the weights are made"
    );
}

use super::tmux::{tmux, Session as Tmux};
use crate::support::bin;

impl Tmux {
    /// The pid of the dflash-top process the pane's shell started.
    fn child_pid(&self) -> i32 {
        let shell: i32 = tmux(&["display", "-p", "-t", &self.0, "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap();
        for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid ...
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                continue;
            };
            let ppid: Option<i32> = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
            if ppid == Some(shell) && head.contains("(dflash-top") {
                return e.file_name().to_string_lossy().parse().unwrap();
            }
        }
        panic!("no dflash-top under the pane's shell {shell}");
    }
}

impl Tmux {
    /// After a command line ending `; echo EXITED=$?; stty -a`: the program exited with the
    /// signal status, its screen is gone, the terminal is in cooked mode, off the alternate screen.
    fn exited_by_a_signal_with_the_terminal_back(&self, what: &str) {
        let after = self.wait_for("the process to exit", |x| x.contains("EXITED="));
        assert!(after.contains("EXITED=130"), "{what}: {after}");
        assert!(
            !after.contains("PROF") && !after.contains("REPLAY"),
            "{what}: the TUI is gone: {after}"
        );
        let stty = self.wait_for("stty's report", |x| x.contains("icanon"));
        let words: Vec<&str> = stty.split_whitespace().collect();
        assert!(
            words.contains(&"icanon") && words.contains(&"echo"),
            "{what}: the terminal is back in cooked mode: {stty}"
        );
        assert_eq!(
            tmux(&["display", "-p", "-t", &self.0, "#{alternate_on}"]).trim(),
            "0",
            "{what}: alternate screen left"
        );
    }
}

impl Tmux {
    /// `ENV dflash-top train ARGS; THEN` in a 100x30 session named after `tag`, returned once
    /// the header shows a step (training is under way).
    fn training(tag: &str, env: &str, args: &str, then: &str) -> Tmux {
        let cmd = format!(
            "{env} {} train {args}; {then}",
            env!("CARGO_BIN_EXE_dflash-top")
        );
        let name = format!("dflash-{tag}-{}", std::process::id());
        let s = Tmux::start_sized(name, (100, 30), &cmd);
        s.wait_for("training steps", |x| header_step(x).is_some_and(|n| n > 0));
        s
    }
}

fn header_step(screen: &str) -> Option<u64> {
    screen
        .lines()
        .next()
        .and_then(|l| l.split("step ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[test]
fn a_signal_stops_the_tui_saves_and_gives_the_terminal_back() {
    for (i, sig) in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT]
        .into_iter()
        .enumerate()
    {
        let save = tempfile::tempdir().unwrap();
        let s = Tmux::training(
            &format!("sig-{i}"),
            "",
            &format!("--save-dir {}", save.path().display()),
            "echo EXITED=$?; stty -a; sleep 600",
        );
        assert_eq!(unsafe { libc::kill(s.child_pid(), sig) }, 0);
        s.exited_by_a_signal_with_the_terminal_back(&format!("signal {sig}"));
        assert_eq!(step_dirs(save.path()).len(), 1, "signal {sig}: saved");
    }
}

#[test]
fn a_second_signal_during_the_tui_s_final_save_restores_the_terminal_and_leaves_nothing() {
    let save = tempfile::tempdir().unwrap();
    let s = Tmux::training(
        "sig2",
        "DFLASH_TOP_FAULT=save_slow",
        &format!("--save-dir {}", save.path().display()),
        "echo EXITED=$?; stty -a; sleep 600",
    );
    let pid = s.child_pid();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_for_a_save_to_begin(save.path());
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    s.exited_by_a_signal_with_the_terminal_back("second signal in the save");
    let left = std::fs::read_dir(save.path()).unwrap().count();
    assert_eq!(
        left,
        0,
        "no checkpoint, whole or partial: {:?}",
        hidden(save.path())
    );
}

/// Viewers (`replay`, `attach`) stop on each signal with the terminal given back; an attached
/// viewer's signal stops the viewer only.
#[test]
fn a_signal_stops_a_viewer_and_gives_the_terminal_back() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.jsonl");
    let o = bin()
        .args(["train", "--headless", "--steps", "3", "--record"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let mut train = bin()
        .args(["train", "--headless", "--interval", "0.2"])
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_steps(&mut train);
    let viewers = [
        ("replay", format!("replay {}", rec.display()), "REPLAY"),
        (
            "attach",
            format!("attach {}", train.id()),
            "attached to PID",
        ),
    ];
    for (what, args, shown) in viewers {
        for (i, sig) in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT]
            .into_iter()
            .enumerate()
        {
            let cmd = format!(
                "XDG_RUNTIME_DIR={} {} {args}; echo EXITED=$?; stty -a; sleep 600",
                dir.path().display(),
                env!("CARGO_BIN_EXE_dflash-top"),
            );
            let s = Tmux::start_sized(
                format!("dflash-{what}-sig-{}-{i}", std::process::id()),
                (100, 30),
                &cmd,
            );
            s.wait_for(what, |x| x.contains(shown));
            assert_eq!(unsafe { libc::kill(s.child_pid(), sig) }, 0);
            s.exited_by_a_signal_with_the_terminal_back(&format!("{what}, signal {sig}"));
        }
    }
    assert!(
        train.try_wait().unwrap().is_none(),
        "the watched run goes on after its viewers' signals"
    );
    kill(&train, libc::SIGTERM);
    wait_exit(&mut train);
}

/// A tmpfs mounted for one test; unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    /// None where mounting is not allowed (not root, or no CAP_SYS_ADMIN in a container).
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_fails_the_save_with_a_sentence_and_keeps_the_previous_checkpoint() {
    // A tiny preset checkpoint is about 5 MB: 8 MB hold one, not a second beside it.
    let Some(fs) = Tmpfs::mount("8m") else {
        println!("note: skipped: cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)");
        return;
    };
    let save = fs.0.path().join("ck");
    let o = bin()
        .args([
            "train",
            "--headless",
            "--steps",
            "3",
            "--save-every",
            "1",
            "--save-dir",
        ])
        .arg(&save)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.starts_with("dflash-top: ") && !err.contains("panicked"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "cannot save the checkpoint {}",
            save.join("step-000002").display()
        )) && err.contains("No space left"),
        "{err}"
    );
    // Said once, with the fix that fits a full disk (the exit's save is not tried again).
    assert_eq!(
        err.matches("cannot save the checkpoint").count(),
        1,
        "{err}"
    );
    assert!(err.contains("free space on that disk"), "{err}");
    assert_eq!(step_dirs(&save), ["step-000001"], "{err}");
    let left = hidden(&save);
    assert!(left.is_empty(), "the failed save cleaned up: {left:?}");
    // The previous checkpoint is whole: a run resumes from it.
    let o = bin()
        .args(["train", "--headless", "--steps", "2", "--resume"])
        .arg(save.join("step-000001"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

fn alive(pid: i32) -> bool {
    // Signal 0 checks existence; a zombie (exited, not yet reaped) counts as gone.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists
        && !state
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z'))
}

#[test]
fn the_tui_keeps_running_and_redrawing_through_small_sizes_and_a_resize_storm() {
    let s = Tmux::training("resize", "", "", "echo EXITED=$?; sleep 600");
    let pid = s.child_pid();
    // A resize every 50 ms through sizes above and below 80x24, for about 3 s.
    let sizes = [
        (60, 15),
        (80, 24),
        (120, 40),
        (79, 23),
        (200, 50),
        (40, 10),
        (81, 25),
    ];
    for i in 0..60 {
        let (x, y) = sizes[i % sizes.len()];
        tmux(&[
            "resize-window",
            "-t",
            &s.0,
            "-x",
            &x.to_string(),
            "-y",
            &y.to_string(),
        ]);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        alive(pid),
        "the TUI died in the resize storm: {}",
        s.screen()
    );
    // Under 80x24 it says so instead of drawing panels; then it redraws at 80x24.
    tmux(&["resize-window", "-t", &s.0, "-x", "60", "-y", "15"]);
    s.wait_for("the too-small note", |x| x.contains("80x24"));
    tmux(&["resize-window", "-t", &s.0, "-x", "80", "-y", "24"]);
    let before = header_step(&s.wait_for("the header again", |x| header_step(x).is_some()));
    s.wait_for("a later step drawn at 80x24", |x| header_step(x) > before);
    s.keys_q();
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
}

impl Tmux {
    /// Quits a live run: `q` asks once, the second stops it.
    fn keys_q(&self) {
        tmux(&["send-keys", "-t", &self.0, "q"]);
        std::thread::sleep(std::time::Duration::from_millis(200));
        tmux(&["send-keys", "-t", &self.0, "q"]);
    }
}

#[test]
fn the_tui_runs_with_proc_hidden_and_shows_no_cpu_figures() {
    // A mount namespace with an empty /proc: the per-thread CPU probe finds nothing to read.
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs none /proc"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        println!("note: skipped: cannot hide /proc here (unshare -m needs root / CAP_SYS_ADMIN)");
        return;
    }
    let cmd = format!(
        "unshare -m sh -c 'mount -t tmpfs none /proc && exec {} train'; echo EXITED=$?; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top")
    );
    let s = Tmux::start_sized(
        format!("dflash-noproc-{}", std::process::id()),
        (100, 30),
        &cmd,
    );
    s.wait_for("training steps", |x| header_step(x).is_some_and(|n| n > 0));
    let screen = s.wait_for("the CPU probe's note", |x| {
        x.contains("per-thread CPU: n/a")
    });
    let row = screen
        .lines()
        .find(|l| l.contains("│drafter-0"))
        .unwrap_or_else(|| panic!("a drafter-0 row: {screen}"));
    assert_eq!(
        row.split_whitespace().nth(1),
        Some("-"),
        "no CPU figure without /proc: {row}"
    );
    s.keys_q();
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
}

/// Socket inodes of `pid` that listen on TCP (IPv4 or IPv6).
fn tcp_listeners(pid: u32) -> Vec<String> {
    let mine: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let mut out = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
        {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if f.len() > 9 && f[3] == "0A" && mine.iter().any(|m| m == f[9]) {
                out.push(format!("{table}: {line}"));
            }
        }
    }
    out
}

#[test]
fn a_run_listens_on_no_tcp_port() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = bin()
        .args(["train", "--headless", "--interval", "0.2", "--record"])
        .arg(dir.path().join("run.jsonl"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_steps(&mut child);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", child.id()))
        .unwrap()
        .count();
    let listening = tcp_listeners(child.id());
    kill(&child, libc::SIGTERM);
    wait_exit(&mut child);
    assert!(fds > 0, "the run's descriptors were read");
    assert!(listening.is_empty(), "listening TCP sockets: {listening:?}");

    // The TUI run too (it also serves viewers, on a Unix socket).
    let s = Tmux::training("notcp", "", "", "sleep 600");
    let listening = tcp_listeners(s.child_pid() as u32);
    s.keys_q();
    assert!(
        listening.is_empty(),
        "TUI: listening TCP sockets: {listening:?}"
    );

    // The check sees a listener where there is one: this test process's own.
    let own = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    assert!(!tcp_listeners(std::process::id()).is_empty());
    drop(own);
}

/// SGR codes of the pane that set a colour (foreground or background, any palette).
fn colour_codes(session: &str) -> Vec<String> {
    let screen = tmux(&["capture-pane", "-p", "-e", "-t", session]);
    screen
        .split('\u{1b}')
        .filter_map(|s| {
            s.strip_prefix('[')?
                .split_once('m')
                .map(|(c, _)| c.to_string())
        })
        .filter(|c| {
            c.split(';').any(|p| {
                matches!(
                    p.parse::<u32>(),
                    Ok(30..=37 | 38 | 40..=47 | 48 | 90..=97 | 100..=107)
                )
            })
        })
        .collect()
}

#[test]
fn no_color_draws_the_real_terminal_without_colour() {
    for no_color in [false, true] {
        let env = if no_color { "NO_COLOR=1" } else { "" };
        let s = Tmux::training(&format!("nocolor-{no_color}"), env, "", "sleep 600");
        let codes = colour_codes(&s.0);
        if no_color {
            assert!(codes.is_empty(), "NO_COLOR set, colours drawn: {codes:?}");
        } else {
            assert!(!codes.is_empty(), "colours drawn without NO_COLOR");
        }
        s.keys_q();
    }
}

#[test]
fn doctor_reports_nvml_in_one_line_present_or_not() {
    let o = bin().arg("doctor").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let nvml: Vec<&str> = out.lines().filter(|l| l.starts_with("NVML")).collect();
    assert_eq!(nvml.len(), 1, "{out}");
    assert!(!stderr(&o).contains("panicked"));
    // Where `--target-precision fp8` runs: on the CPU emulated, on a GPU its FP8 tensor cores or
    // why not.
    let fp8: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("FP8 target"))
        .collect();
    assert_eq!(fp8.len(), 1, "{out}");
    let cuda = out
        .lines()
        .any(|l| l.starts_with("CUDA ") && l.contains("available,"));
    let expected = if cuda {
        "cuda:0"
    } else {
        "emulated on the CPU"
    };
    assert!(fp8[0].contains(expected), "{out}");
}

#[test]
fn without_nvml_a_run_shows_one_no_gpu_line_and_no_error() {
    // `no_nvml` loads NVML from where it is not: the failure of a machine without the driver.
    let o = bin()
        .arg("doctor")
        .env("DFLASH_TOP_FAULT", "no_nvml")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let nvml: Vec<&str> = out.lines().filter(|l| l.starts_with("NVML")).collect();
    assert_eq!(nvml.len(), 1, "{out}");
    assert!(nvml[0].contains("no NVIDIA GPU"), "{out}");

    let (o, _dir) = run_with_fault("no_nvml", &["--steps", "2"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("NVML") && !err.contains("panicked"), "{err}");

    let s = Tmux::training(
        "nonvml",
        "DFLASH_TOP_FAULT=no_nvml",
        "",
        "echo EXITED=$?; sleep 600",
    );
    s.keys("4");
    let screen = s.wait_for("the queues+gpu view", |x| x.contains("4 queues+gpu"));
    let gpu_lines: Vec<&str> = screen.lines().filter(|l| l.contains("GPU")).collect();
    assert_eq!(gpu_lines.len(), 1, "one GPU line: {screen}");
    assert!(
        gpu_lines[0].starts_with("GPUs: no NVIDIA GPU (NVML not found"),
        "{screen}"
    );
    s.keys_q();
    let after = s.wait_for("the process to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
}

#[test]
fn a_hang_up_stops_the_tui_and_saves() {
    // The terminal goes away (an SSH session dropped): tmux closes the pane's pty.
    let save = tempfile::tempdir().unwrap();
    let s = Tmux::training(
        "hangup",
        "",
        &format!("--save-dir {}", save.path().display()),
        "sleep 600",
    );
    let pid = s.child_pid();
    drop(s);
    let start = Instant::now();
    while alive(pid) {
        if start.elapsed() > Duration::from_secs(90) {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the TUI outlived its terminal");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(step_dirs(save.path()).len(), 1, "the last step was saved");
}

/// Issue 24: a `--record` that fails mid-run (/dev/full: every write is "no space left") is
/// reported when it fails — the headless lines carry it from then on — and training goes on to
/// its last step and saves.
#[test]
fn a_failing_record_is_reported_when_it_fails_and_training_goes_on() {
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full here: the failing recording is not tried");
        return;
    }
    let (o, dir) = run_with_fault(
        "",
        &[
            "--steps",
            "150",
            "--save-every",
            "150",
            "--record",
            "/dev/full",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let step = |l: &str| -> u64 {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix("step="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let alert = "alert=\"--record /dev/full: writing failed";
    let first = out
        .lines()
        .find(|l| l.contains(alert))
        .unwrap_or_else(|| panic!("no line reports the recording: {out}"));
    assert!(
        first.contains("training goes on") && first.contains("free space"),
        "{first}"
    );
    // Reported while the run was under way, and every later line keeps it.
    assert!(step(first) < 150, "reported only at the end: {first}");
    let later: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("t="))
        .skip_while(|l| !l.contains(alert))
        .collect();
    assert!(later.iter().all(|l| l.contains(alert)), "{out}");
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert!(summary.contains("step=150 "), "{summary}");
    assert_eq!(step_dirs(dir.path()), ["step-000150"]);
}
