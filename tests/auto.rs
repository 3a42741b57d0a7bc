//! Zero-code mode (issue 26): unmodified Python scripts under `python -m dflash_top run`,
//! watched by `dflash-top attach --headless`: the repository's own Python peer (a target
//! thread, a queue, a drafter trained on the main thread) and a DataLoader loop with an
//! `.item()` a step, whose host sync is a phase of its own with a count.

use crate::support::repo;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `python -m dflash_top run SCRIPT ARGS` serving in `runtime` (its XDG_RUNTIME_DIR).
fn run_script(runtime: &Path, script: &str, args: &[&str]) -> Child {
    Command::new(repo().join(".venv/bin/python"))
        .args(["-m", "dflash_top", "run"])
        .arg(repo().join(script))
        .args(args)
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(".venv/bin/python runs (make venv)")
}

/// Attaches headless as soon as the script serves (before its threads start: the table grows
/// while the viewer watches) until `done` holds for a line, or a minute.
fn watch(runtime: &Path, mut child: Child, done: impl Fn(&str) -> bool) -> String {
    let sock = crate::support::socket_of(runtime, child.id());
    let start = Instant::now();
    while !sock.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the script never served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut viewer = Command::new(env!("CARGO_BIN_EXE_dflash-top"))
        .args(["attach", &child.id().to_string(), "--headless"])
        .args(["--seconds", "90", "--interval", "1"])
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = std::io::BufReader::new(viewer.stdout.take().unwrap());
    let mut seen = None;
    for line in std::io::BufRead::lines(out) {
        let line = line.unwrap();
        if line.starts_with("t=") && done(&line) {
            seen = Some(line);
            break;
        }
    }
    for p in [&mut viewer, &mut child] {
        let _ = p.kill();
        let _ = p.wait();
    }
    seen.expect("the viewer never showed what was expected (or stopped)")
}

/// The `NAME_ms=` (or `NAME_n=`) value in thread `thread`'s part of a headless line.
fn field(line: &str, thread: &str, name: &str) -> Option<f64> {
    let part = line
        .split(" | ")
        .find(|p| p.starts_with(&format!("{thread} step_ms=")))?;
    part.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .map(|v| v.parse().unwrap())
}

fn step_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("step="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn tok_per_s(line: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("tok/s="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_python_peer_unmodified_shows_its_target_thread_queue_and_drafter_phases() {
    let runtime = tempfile::tempdir().unwrap();
    let child = run_script(
        runtime.path(),
        "python/peer/dflash_peer.py",
        &[
            "--preset",
            "tiny",
            "--device",
            "cpu",
            "--steps",
            "100000",
            "--warmup",
            "1",
            "--seq",
            "128",
            "--batch",
            "1",
            "--anchors",
            "8",
        ],
    );
    // The drafter trains on the main thread: its forward is its model's class.
    let drafter = |l: &str, p: &str| field(l, "MainThread", p).unwrap_or(0.0) > 0.0;
    // Tokens (the target's input_ids) travel with the queue's items to the last stage.
    let line = watch(runtime.path(), child, |l| {
        field(l, "target-0", "Qwen3Model_ms").unwrap_or(0.0) > 0.0
            && ["DFlashDraftModel_ms", "backward_ms", "optim_ms"]
                .iter()
                .all(|p| drafter(l, p))
            && l.contains("| q.target>main=")
            && tok_per_s(l) > 0.0
            // The loss shows one step late: from the second step on.
            && step_of(l) >= 2
    });
    // The target thread is a stage of its own, upstream of the queue into the main thread.
    let depth = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("q.target>main="))
        .unwrap();
    assert!(
        depth.ends_with("/2"),
        "the peer's queue.Queue(maxsize=2): {line}"
    );
    assert!(field(&line, "MainThread", "clip_ms").is_some(), "{line}");
    assert!(
        field(&line, "MainThread", "sync_n").unwrap_or(0.0) > 0.0,
        "host syncs counted: {line}"
    );
    // The loss its backward() took is shown; nothing it never had (tau) is made up.
    assert!(
        !line.contains(" loss=- ") && line.contains(" tau=- "),
        "{line}"
    );
}

#[test]
fn a_dataloader_loop_shows_its_item_sync_as_a_phase_with_a_count() {
    let runtime = tempfile::tempdir().unwrap();
    let child = run_script(runtime.path(), "tests/fixtures/auto_loader.py", &[]);
    // A line with each phase measured (a tiny step's tenths of a millisecond can round to 0.0).
    let line = watch(runtime.path(), child, |l| {
        field(l, "MainThread", "sync_n").is_some()
            && ["data_wait_ms", "optim_ms", "Sequential_ms"]
                .iter()
                .all(|p| field(l, "MainThread", p).unwrap_or(0.0) > 0.0)
    });
    // One `.item()` a step (SGD makes none): one sync per step.
    let n = field(&line, "MainThread", "sync_n").unwrap();
    assert!((0.5..=1.5).contains(&n), "one sync a step: {line}");
    assert!(field(&line, "MainThread", "sync_ms").is_some(), "{line}");
}

/// Issue 28: an unmodified loop that pads each batch to its longest row changes shape every step,
/// and `shapes_vary` names its stage and thread (read from the `input_ids` elements of its
/// forwards); the same loop padding to one length raises nothing of the kind.
#[test]
fn a_loop_padding_each_batch_to_its_longest_row_warns_that_shapes_vary() {
    let runtime = tempfile::tempdir().unwrap();
    let child = run_script(runtime.path(), "tests/fixtures/auto_padded.py", &[]);
    let line = watch(runtime.path(), child, |l| l.contains("warn=shapes_vary"));
    assert!(line.contains("warn=shapes_vary:main"), "{line}");
    let child = run_script(
        runtime.path(),
        "tests/fixtures/auto_padded.py",
        &["--fixed"],
    );
    let seen = std::cell::RefCell::new(Vec::new());
    // Past the rule's 16 steps and 5 s hold, several times over.
    let line = watch(runtime.path(), child, |l| {
        seen.borrow_mut().push(l.to_string());
        crate::warnings::elapsed_s(l).is_some_and(|t| t >= 12.0)
            && field(l, "MainThread", "optim_ms").unwrap_or(0.0) > 0.0
    });
    // Its forwards were seen and their tokens counted: the silence is about its shapes.
    assert!(
        field(&line, "MainThread", "TinyLM_ms").unwrap() > 0.0,
        "{line}"
    );
    assert!(tok_per_s(&line) > 0.0, "{line}");
    let warned: Vec<String> = seen
        .take()
        .into_iter()
        .filter(|l| l.contains("shapes_vary"))
        .collect();
    assert!(warned.is_empty(), "{warned:?}");
}

/// The verdict follows a slowed stage of an unmodified pipeline: stages named by their threads,
/// ordered by the queue between them.
#[test]
fn the_verdict_follows_a_slowed_stage_of_an_unmodified_pipeline() {
    for (slow, verdict) in [("target", "target-bound"), ("drafter", "drafter-bound")] {
        let runtime = tempfile::tempdir().unwrap();
        let child = run_script(
            runtime.path(),
            "tests/fixtures/auto_chain.py",
            &["--slow", slow],
        );
        let line = watch(runtime.path(), child, |l| {
            l.contains(&format!("verdict={verdict} "))
        });
        assert!(line.contains("| q.target>drafter="), "{line}");
    }
}

/// Issue 41: a trainer that passes dict batches through a queue, unmodified: its tok/s (the
/// tokens it consumed, all of them), its step count and its loss (one step late, read without a
/// host sync), each thread with its own phases only, its `.item()` named by its line, and
/// `attach --list` showing its steps and tok/s.
#[test]
fn an_unmodified_trainer_shows_its_tokens_loss_steps_and_the_line_of_its_item() {
    let runtime = tempfile::tempdir().unwrap();
    let script = "tests/fixtures/auto_trainer.py";
    let mut child = Command::new(repo().join(".venv/bin/python"))
        .args(["-m", "dflash_top", "run"])
        .arg(script)
        .args(["--steps", "300", "--go"])
        .arg(runtime.path().join("go"))
        .current_dir(repo())
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect(".venv/bin/python runs (make venv)");
    let sock = crate::support::served_socket("the trainer serves", runtime.path(), child.id());
    let record = runtime.path().join("view.jsonl");
    let mut viewer = Command::new(env!("CARGO_BIN_EXE_dflash-top"))
        .args(["attach", &child.id().to_string(), "--headless"])
        .args(["--seconds", "120", "--interval", "1", "--record"])
        .arg(&record)
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The training starts once the viewer is attached (its first line).
    let mut view = std::io::BufReader::new(viewer.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut view, &mut first).unwrap();
    assert!(first.starts_with("attached to PID"), "{first}");
    std::fs::write(runtime.path().join("go"), "").unwrap();
    // While it trains: `attach --list` shows its steps and tokens a second.
    let info = sock.with_extension("info");
    crate::support::wait_until("the trainer writes its stats", || {
        std::fs::read_to_string(&info).is_ok_and(|s| !s.contains("\"step\":0,"))
    });
    let list = Command::new(env!("CARGO_BIN_EXE_dflash-top"))
        .args(["attach", "--list"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout).to_string();
    let row = list
        .lines()
        .find(|l| l.contains(&child.id().to_string()))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        !row.contains('–'),
        "its steps, tok/s and viewers known: {list}"
    );

    let out = std::io::read_to_string(view).unwrap();
    let err = std::io::read_to_string(viewer.stderr.take().unwrap()).unwrap();
    viewer.wait().unwrap();
    let printed = std::io::read_to_string(child.stdout.take().unwrap()).unwrap();
    assert!(child.wait().unwrap().success(), "{printed}");
    assert!(err.contains("the session ended"), "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
    // The view's last snapshot, as `attach --record` kept it.
    let text = std::fs::read_to_string(&record).unwrap();
    let snap: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let train = &snap["train"];
    // Every token the script consumed, counted once.
    let consumed: f64 = printed
        .lines()
        .find_map(|l| l.strip_prefix("tokens "))
        .unwrap()
        .parse()
        .unwrap();
    let tokens = train["tokens_total"].as_f64().unwrap();
    assert!(
        (tokens - consumed).abs() <= consumed * 0.05,
        "{tokens} tokens shown, {consumed} consumed: {train}"
    );
    assert!(lines.iter().any(|l| tok_per_s(l) > 0.0), "{out}");
    // The last step's record carries the loss of the step before it.
    let losses: Vec<f64> = printed
        .lines()
        .filter_map(|l| l.split_once(" loss ").map(|(_, v)| v.parse().unwrap()))
        .collect();
    assert_eq!(losses.len(), 300);
    let shown = train["loss"].as_f64().unwrap();
    assert!(
        (shown - losses[298]).abs() < 2e-4,
        "{shown} shown, {} printed at step 299: {train}",
        losses[298]
    );
    assert_eq!(train["step"], 300, "{train}");
    // The `.item()` of its log, by its line: one a step.
    let text = std::fs::read_to_string(repo().join(script)).unwrap();
    let line_no = text.lines().position(|l| l.contains("SYNC-SITE")).unwrap() + 1;
    let site = format!("sync_top=\"{script}:{line_no} .item() x1.0");
    let last = lines.last().unwrap();
    assert!(last.contains(&site), "{site} missing: {last}");
    let sites = snap["sync_sites"].as_array().unwrap();
    let item = &sites[0];
    assert_eq!(item["thread"], "MainThread", "{sites:?}");
    assert_eq!(item["at"], format!("{script}:{line_no}"), "{sites:?}");
    // One a step (the sites come once a second): every step but the first, which ended at its
    // forward before an optimizer step was seen; a sample taken between a step's optimizer step
    // (where it ends) and its `.item()` has that step's not yet counted.
    let (count, steps) = (
        item["count"].as_u64().unwrap(),
        item["steps"].as_u64().unwrap(),
    );
    assert!(
        (count + 1 == steps || count + 2 == steps) && count > 50,
        "one .item() a step: {sites:?}"
    );
    assert!(item["ns"].as_u64().unwrap() > 0, "{sites:?}");
    // Each thread its own phases: the loader never runs the model or backward, the main
    // thread never puts.
    let part = |name: &str| {
        last.split(" | ")
            .find(|p| p.starts_with(&format!("{name} step_ms=")))
            .unwrap_or_else(|| panic!("no {name}: {last}"))
            .to_string()
    };
    let (loader, main) = (part("loader"), part("MainThread"));
    for p in ["backward_ms=", "TinyLM_ms=", "optim_ms="] {
        assert!(!loader.contains(p), "{p} in the loader's: {loader}");
        assert!(main.contains(p), "{p} missing in the main thread's: {main}");
    }
    assert!(!main.contains("push_wait_ms="), "{main}");
}

/// Issue 41: `torchrun --nproc-per-node 2 -m dflash_top run` of a Gloo data-parallel trainer
/// with DataLoader worker processes: each rank a session carrying the job's id, `attach --job`
/// showing both ranks merged (`r0/MainThread`, `r1/MainThread`), tokens summed over the ranks
/// and equal to what they consumed, each rank's `.item()` by its line.
#[test]
fn a_torchrun_job_of_two_ranks_shows_both_ranks_merged_under_attach_job() {
    let runtime = tempfile::tempdir().unwrap();
    let script = "tests/fixtures/auto_ddp.py";
    let go = runtime.path().join("go");
    let mut job = Command::new(repo().join(".venv/bin/torchrun"))
        .args(["--nproc-per-node", "2", "--master-port", "29731"])
        .args(["-m", "dflash_top", "run", script, "--workers", "2", "--go"])
        .arg(&go)
        .current_dir(repo())
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect(".venv/bin/torchrun runs (make venv)");
    let dir = runtime.path().join("dflash-top");
    // Both ranks serve, each saying its job in its stats file.
    crate::support::wait_until("both ranks write their stats", || {
        std::fs::read_dir(&dir).is_ok_and(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
                .filter(|s| s.contains("\"job\":{\"id\":\"127.0.0.1:29731\""))
                .count()
                == 2
        })
    });
    let record = runtime.path().join("view.jsonl");
    let mut viewer = Command::new(env!("CARGO_BIN_EXE_dflash-top"))
        .args([
            "attach",
            "--job",
            "--headless",
            "--seconds",
            "120",
            "--interval",
            "1",
        ])
        .arg("--record")
        .arg(&record)
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut view = std::io::BufReader::new(viewer.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut view, &mut first).unwrap();
    assert!(
        first.starts_with("attached to 2 sessions (r0 PID"),
        "{first}"
    );
    std::fs::write(&go, "").unwrap();
    let out = std::io::read_to_string(view).unwrap();
    let err = std::io::read_to_string(viewer.stderr.take().unwrap()).unwrap();
    viewer.wait().unwrap();
    let printed = std::io::read_to_string(job.stdout.take().unwrap()).unwrap();
    assert!(job.wait().unwrap().success(), "{printed}");
    assert!(err.contains("every session ended"), "{err}");
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
    let line_no = std::fs::read_to_string(repo().join(script))
        .unwrap()
        .lines()
        .position(|l| l.contains("SYNC-SITE"))
        .unwrap()
        + 1;
    let last = lines
        .iter()
        .rev()
        // Both ranks still running and both paced (the last lines may come after one rank
        // ended, or while one no longer steps: then the job names no slowest rank).
        .find(|l| {
            l.contains("| r0/MainThread step_ms=")
                && l.contains("| r1/MainThread step_ms=")
                && l.contains("sync_top=")
                && l.contains(" slowest=r")
        })
        .unwrap_or_else(|| panic!("{out}"));
    for part in [
        "| r0/MainThread step_ms=".to_string(),
        "| r1/MainThread step_ms=".into(),
        "data_wait_ms=".into(),
        "DistributedDataParallel_ms=".into(),
        format!("sync_top=\"{script}:{line_no} .item() x1.0"),
        " r0.tok/s=".into(),
        " r1.tok/s=".into(),
        " slowest=r".into(),
    ] {
        assert!(last.contains(&part), "{part} missing: {last}");
    }
    // Tokens: the ranks' sum, what they consumed (each prints `rank R tokens N`; the two
    // processes share one pipe, so a line is read by its pieces, not whole).
    let mut by_rank = std::collections::BTreeMap::new();
    for piece in printed.split("rank ").skip(1) {
        let mut words = piece.split_whitespace();
        let (Some(rank), Some("tokens"), Some(n)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let digits: String = n.chars().take_while(|c| c.is_ascii_digit()).collect();
        if let (Ok(rank), Ok(n)) = (rank.parse::<u32>(), digits.parse::<f64>()) {
            by_rank.insert(rank, n);
        }
    }
    assert_eq!(by_rank.len(), 2, "each rank's tokens printed: {printed}");
    let consumed: f64 = by_rank.values().sum();
    let text = std::fs::read_to_string(&record).unwrap();
    let snap: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let tokens = snap["train"]["tokens_total"].as_f64().unwrap();
    assert!(
        consumed > 0.0 && (tokens - consumed).abs() <= consumed * 0.05,
        "{tokens} tokens shown, {consumed} consumed by the ranks"
    );
    assert!(lines.iter().any(|l| tok_per_s(l) > 0.0), "{out}");
}
