//! One view of a multi-process job (issue 30): two real `train --headless` ranks of one job
//! (RANK 0 and 1, WORLD_SIZE 2), `attach --list` naming the job, `attach --job --headless` and
//! `attach A B` merging them (threads and queues named by rank, tok/s summed), bad input as
//! sentences, and the merged header on a screen.

use super::tui::{screen, starved_snapshot, LIVE};
use crate::support::{bin, free_port, stderr, stdout, wait_until};
use dflash_top::telemetry::verdict::Verdict;
use dflash_top::tui::app::App;
use dflash_top::tui::theme::Theme;
use dflash_top::wire::merge::{merge, Part};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::Arc;

/// A port nobody listens on now.
/// Two ranks of one job, training on the CPU until dropped, their sockets in a runtime dir of
/// their own.
struct Job {
    runtime: tempfile::TempDir,
    ranks: Vec<Child>,
    port: u16,
}

impl Job {
    fn start() -> Job {
        let runtime = tempfile::tempdir().unwrap();
        let port = free_port();
        let ranks = (0..2)
            .map(|rank| {
                crate::support::endless_train(runtime.path(), 60)
                    .env("RANK", rank.to_string())
                    .env("LOCAL_RANK", rank.to_string())
                    .env("WORLD_SIZE", "2")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string())
                    .env_remove("TORCHELASTIC_RUN_ID")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        Job {
            runtime,
            ranks,
            port,
        }
    }

    fn socket(&self, rank: usize) -> PathBuf {
        crate::support::socket_of(self.runtime.path(), self.ranks[rank].id())
    }

    fn attach(&self, args: &[&str]) -> Output {
        attach_in(self.runtime.path(), args)
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        for r in &mut self.ranks {
            let _ = r.kill();
            let _ = r.wait();
        }
    }
}

fn attach_in(runtime: &Path, args: &[&str]) -> Output {
    bin()
        .arg("attach")
        .args(args)
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .unwrap()
}

/// The number of `key=` in an interval line (the test fails where there is none).
fn field(line: &str, key: &str) -> f64 {
    super::support::field(line, key).unwrap_or_else(|| panic!("no number {key}= in {line}"))
}

/// The last interval line of a headless viewer.
fn last_line(o: &Output) -> String {
    assert!(o.status.success(), "{}", stderr(o));
    stdout(o)
        .lines()
        .rfind(|l| l.starts_with("t="))
        .unwrap_or_else(|| panic!("no interval line: {}", stdout(o)))
        .to_string()
}

/// Both ranks' threads and queues, named by rank, and the header's tok/s their sum.
fn assert_both_ranks(line: &str) {
    for part in [
        "| r0/loader ",
        "| r0/target-0 ",
        "| r0/drafter-0 ",
        "| r1/loader ",
        "| r1/target-0 ",
        "| r1/drafter-0 ",
        "| q.r0/hs=",
        "| q.r1/batch=",
        " slowest=r",
        " verdict.rank=r",
    ] {
        assert!(line.contains(part), "{part:?} missing: {line}");
    }
    let (sum, r0, r1) = (
        field(line, "tok/s"),
        field(line, "r0.tok/s"),
        field(line, "r1.tok/s"),
    );
    assert!(r0 > 0.0 && r1 > 0.0, "both ranks train: {line}");
    // Each printed rounded: the sum within one token a second of theirs.
    assert!(
        (sum - (r0 + r1)).abs() <= 1.0,
        "{sum} != {r0} + {r1}: {line}"
    );
}

#[test]
fn attach_job_shows_both_ranks_and_attach_a_b_merges_them() {
    let job = Job::start();
    let id = format!("127.0.0.1:{}", job.port);
    // The sessions carry their job: the listing names it once each rank wrote its stats.
    let list = std::cell::RefCell::new(String::new());
    wait_until("both ranks listed with their job", || {
        let text = stdout(&job.attach(&["--list"]));
        let both = (0..2).all(|r| text.contains(&format!("job {id} rank {r}/2")));
        *list.borrow_mut() = text;
        both
    });
    let list = list.into_inner();
    for r in 0..2 {
        let row = list
            .lines()
            .find(|l| l.contains(&job.socket(r).display().to_string()))
            .unwrap_or_else(|| panic!("no row for rank {r}: {list}"));
        assert!(row.ends_with(&format!("job {id} rank {r}/2")), "{row}");
    }
    // `--job` with no id: the one job here.
    let o = job.attach(&["--job", "--headless", "--seconds", "4", "--interval", "1"]);
    assert!(
        stdout(&o).starts_with("attached to 2 sessions (r0 PID "),
        "{}",
        stdout(&o)
    );
    assert_both_ranks(&last_line(&o));
    // The same by its id, recorded: the recording holds the merged view, names and all. A trace
    // holds the threads that ended a step while it recorded; on a loaded host a rank's drafter
    // step can outlast a short recording, so a longer one is tried before the test fails.
    let rec = job.runtime.path().join("job.jsonl");
    let trace = job.runtime.path().join("job.json");
    let names = ["r0/drafter-0", "r1/drafter-0"];
    let mut text = String::new();
    for seconds in ["3", "8", "20"] {
        let o = job.attach(&[
            "--job",
            &id,
            "--headless",
            "--seconds",
            seconds,
            "--record",
            rec.to_str().unwrap(),
        ]);
        assert_both_ranks(&last_line(&o));
        assert!(stderr(&o).contains("recorded "), "{}", stderr(&o));
        assert!(stderr(&o).contains("; they go on"), "{}", stderr(&o));
        let e = bin()
            .args([
                "export",
                rec.to_str().unwrap(),
                "--chrome",
                trace.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(e.status.success(), "{}", stderr(&e));
        text = std::fs::read_to_string(&trace).unwrap();
        if names.iter().all(|n| text.contains(n)) {
            break;
        }
    }
    for name in names {
        assert!(
            text.contains(name),
            "{name} in the merged recording's trace"
        );
    }
    let o = job.attach(&[
        "--job",
        "--headless",
        "--seconds",
        "1",
        "--record",
        "/no/such/dir/x.jsonl",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--record /no/such/dir/x.jsonl: cannot create it"),
        "{}",
        stderr(&o)
    );
    // By the two sockets.
    let (a, b) = (job.socket(1), job.socket(0));
    let o = job.attach(&[
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--headless",
        "--seconds",
        "3",
    ]);
    assert_both_ranks(&last_line(&o));
    // A job that is not here is a sentence naming the one that is.
    let o = job.attach(&["--job", "nosuch", "--headless", "--seconds", "1"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no running session of job \"nosuch\"") && e.contains(&id),
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
}

#[test]
fn a_path_that_is_no_session_and_a_job_that_is_not_there_are_sentences() {
    let runtime = tempfile::tempdir().unwrap();
    let missing = runtime.path().join("gone.sock");
    let plain = runtime.path().join("notes.txt");
    std::fs::write(&plain, "x").unwrap();
    for (path, why) in [(&missing, "no such file"), (&plain, "it is no socket")] {
        let o = attach_in(runtime.path(), &[path.to_str().unwrap(), "--headless"]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert!(
            e.contains(&format!(
                "{} is not a dflash-top session's socket ({why})",
                path.display()
            )),
            "{e}"
        );
        assert!(!e.contains("panicked"), "{e}");
    }
    let o = attach_in(runtime.path(), &["--job", "--headless"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("no session of a multi-process job"),
        "{}",
        stderr(&o)
    );
    let o = attach_in(
        runtime.path(),
        &["--job", "j", missing.to_str().unwrap(), "--headless"],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--job and sockets together"),
        "{}",
        stderr(&o)
    );
}

/// A Python pipeline beside a trainer: two pipelines, refused as one view, both named.
/// A trainer beside a Python pipeline is one view: each session's threads under their own
/// stage's phase names (ours built in, the pipeline's declared). Two different declared
/// pipelines are refused with a sentence naming both.
#[test]
fn a_trainer_and_a_python_pipeline_merge_but_two_declared_pipelines_do_not() {
    let job = Job::start();
    let mut python = super::attach::python_pipeline(job.runtime.path(), None);
    let py_sock = crate::support::socket_of(job.runtime.path(), python.id());
    wait_until("both sockets", || {
        job.socket(0).exists() && py_sock.exists()
    });
    let o = job.attach(&[
        job.socket(0).to_str().unwrap(),
        py_sock.to_str().unwrap(),
        "--headless",
        "--seconds",
        "3",
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out
        .lines()
        .rfind(|l| l.starts_with("t="))
        .expect("merged interval lines");
    let label = format!("p{}", python.id());
    for part in [
        "| r0/drafter-0 step_ms=".to_string(),
        "hs_wait_ms=".into(),
        format!("| {label}/consumer step_ms="),
        format!("| {label}/producer step_ms="),
        "make_ms=".into(),
        format!("q.{label}/batches="),
    ] {
        assert!(last.contains(&part), "{part} missing: {last}");
    }
    // The pipeline's `forward` is its consumer's, not our drafter's list of phases.
    let consumer = last
        .split(" | ")
        .find(|p| p.starts_with(&format!("{label}/consumer")))
        .unwrap();
    assert!(!consumer.contains("hs_wait_ms="), "{consumer}");
    assert!(consumer.contains("forward_ms="), "{consumer}");

    // Another pipeline that declares stages of its own, beside the first: refused.
    let (mut named, named_sock) = super::names::named_pipeline(job.runtime.path());
    let o = job.attach(&[
        py_sock.to_str().unwrap(),
        named_sock.to_str().unwrap(),
        "--headless",
        "--seconds",
        "2",
    ]);
    for c in [&mut python, &mut named] {
        let _ = c.kill();
        let _ = c.wait();
    }
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("these sessions run different pipelines")
            && err.contains("producer → consumer")
            && err.contains("target → drafter"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_merged_header_sums_tokens_and_names_the_slowest_rank_and_the_worst_verdict() {
    let fast = starved_snapshot();
    let mut slow = starved_snapshot();
    slow.train.tok_per_s_1s = 3200.0;
    slow.verdict = Verdict::DrafterBound;
    let parts = [
        Part {
            label: "r0",
            snap: &fast,
            ended: false,
        },
        Part {
            label: "r1",
            snap: &slow,
            ended: false,
        },
    ];
    let mut app = App::new();
    app.on_snapshot(Arc::new(merge(&parts, 1)));
    let s = screen(&app, 120, 36, Theme::from_color(true), LIVE);
    let first = s.lines().next().unwrap();
    assert!(first.contains("tok/s 9344"), "6144 + 3200: {first}");
    assert!(first.contains("slowest r1 (3200 tok/s)"), "{first}");
    let second = s.lines().nth(1).unwrap();
    assert!(
        second.contains(&format!("r1: {}", Verdict::DrafterBound.text())),
        "{second}"
    );
    for name in [
        "r0/drafter-0",
        "r1/drafter-0",
        "r0/hs queue",
        "r1/batch queue",
    ] {
        assert!(s.contains(name), "{name} missing:\n{s}");
    }
    insta::assert_snapshot!("job_merged_1_overview_120x36", s);
}
