//! Declared names win (issue 26): a Python pipeline whose stages are named like ours (`target`,
//! `drafter`) with phase lists of its own is shown with its declared phases under its declared
//! names — in headless lines, in a recording's Chrome export and in its replay — and the
//! training numbers it never reports are shown as absent. Each view runs as a process of its
//! own, as a user runs it; the names travel with the snapshots, so two pipelines' snapshots
//! render apart in one process too.

use crate::support::{bin, repo};
use dflash_top::wire::protocol::*;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The fixture pipeline, serving in `runtime` (its XDG_RUNTIME_DIR), and its socket once there.
pub fn named_pipeline(runtime: &Path) -> (Child, PathBuf) {
    let child = Command::new(repo().join(".venv/bin/python"))
        .arg(repo().join("tests/fixtures/dflash_named.py"))
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(".venv/bin/python runs (make venv)");
    let sock = crate::support::served_socket("the Python pipeline's socket", runtime, child.id());
    (child, sock)
}

fn stop(mut child: Child) {
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(
        child.wait().unwrap().success(),
        "the pipeline stops on SIGTERM"
    );
}

/// The phase fields (`forward_ms=` ...) of thread `name` in a headless line, in order.
fn phase_fields<'a>(line: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    let part = line
        .split(" | ")
        .find(|p| p.starts_with(&format!("{name} step_ms=")))
        .unwrap_or_else(|| panic!("no thread {name} in: {line}"));
    part.split_whitespace()
        .filter_map(|kv| kv.split_once("_ms="))
        .filter(|(k, _)| *k != "step")
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect()
}

fn names<'a>(line: &'a str, thread: &str) -> Vec<&'a str> {
    phase_fields(line, thread).iter().map(|(k, _)| *k).collect()
}

const TARGET_PHASES: [&str; 3] = ["forward", "push_wait", "other"];
const DRAFTER_PHASES: [&str; 8] = [
    "pop_wait", "anchors", "forward", "loss", "backward", "optim", "metrics", "other",
];

/// Its target's forward was drawn as our `batch_wait`, its drafter's optim as `grad_sync`.
#[test]
fn attached_headless_the_declared_phases_show_under_their_names() {
    let runtime = tempfile::tempdir().unwrap();
    let (child, _) = named_pipeline(runtime.path());
    let o = crate::support::attach_headless(runtime.path(), child.id(), 5);
    stop(child);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out
        .lines()
        .rfind(|l| l.starts_with("t="))
        .expect("interval lines");
    assert_eq!(names(last, "target-0"), TARGET_PHASES, "{last}");
    assert!(
        phase_fields(last, "target-0")[0].1 > 0.0,
        "the target's forward time is its own: {last}"
    );
    let drafter = phase_fields(last, "drafter-0");
    // A thread's line lists the phases it entered: the drafter's wait on the queue only where it
    // waited.
    let got = names(last, "drafter-0");
    let want: Vec<&str> = DRAFTER_PHASES
        .into_iter()
        .filter(|p| *p != "pop_wait" || got.contains(p))
        .collect();
    assert_eq!(got, want, "{last}");
    for (k, ms) in drafter
        .iter()
        .filter(|(k, _)| !["pop_wait", "other"].contains(k))
    {
        assert!(
            *ms > 0.0,
            "{k} holds what the drafter marked as {k}: {last}"
        );
    }
    assert!(last.contains("| q.hs="), "{last}");
    // It reports a loss only: tau, lr and the grad norm are absent, not zeros.
    assert!(
        last.contains(" loss=") && !last.contains(" loss=- "),
        "{last}"
    );
    for absent in [" tau=- ", " lr=- ", " gnorm=- "] {
        assert!(last.contains(absent), "{absent}: {last}");
    }
}

/// The same pipeline's stream kept as a recording (what `--record` writes): `export` names the
/// Chrome trace's slices with the declared stages and phases, and `replay` shows them.
#[test]
fn a_recording_keeps_the_declared_names_in_export_and_replay() {
    let runtime = tempfile::tempdir().unwrap();
    let (child, sock) = named_pipeline(runtime.path());
    let rec = runtime.path().join("named.dft");
    {
        let mut s = UnixStream::connect(&sock).unwrap();
        write_preamble(&mut s).unwrap();
        read_preamble(&mut s).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&rec).unwrap(),
            flate2::Compression::default(),
        );
        write_preamble(&mut gz).unwrap();
        let start = Instant::now();
        let mut steps = 0;
        while start.elapsed() < Duration::from_secs(3) || steps < 20 {
            let m = read_msg(&mut s).unwrap().expect("the pipeline streams");
            steps += matches!(&m, Msg::Step(st) if st.prof) as u32;
            write_msg(&mut gz, &m).unwrap();
        }
        use std::io::Write;
        gz.finish().unwrap().flush().unwrap();
    }
    stop(child);

    let out = runtime.path().join("trace.json");
    let o = bin()
        .arg("export")
        .arg(&rec)
        .arg("--chrome")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let mut slices = std::collections::BTreeSet::new();
    for e in trace["traceEvents"].as_array().unwrap() {
        if e["ph"] == "X" {
            let s = |k: &str| e[k].as_str().unwrap().to_string();
            slices.insert((s("cat"), s("name")));
        }
    }
    for (stage, phase) in &slices {
        let declared: &[&str] = match stage.as_str() {
            "target" => &TARGET_PHASES,
            "drafter" => &DRAFTER_PHASES,
            other => panic!("a slice of stage {other}: {slices:?}"),
        };
        assert!(
            declared.contains(&phase.as_str()),
            "{stage}/{phase} is not declared"
        );
    }
    for (stage, phase) in [
        ("target", "forward"),
        ("drafter", "anchors"),
        ("drafter", "optim"),
    ] {
        assert!(
            slices.contains(&(stage.into(), phase.into())),
            "{stage}/{phase}: {slices:?}"
        );
    }

    // Replay in a real terminal (a process of its own, with the recording's names), on the
    // phases view.
    let cmd = format!(
        "{} replay {}; sleep 600",
        env!("CARGO_BIN_EXE_dflash-top"),
        rec.display()
    );
    let tui = crate::tmux::Session::start_sized(
        format!("dflash-names-{}", std::process::id()),
        (160, 40),
        &cmd,
    );
    tui.wait_for("the replay's threads", |x| {
        x.contains("target-0") && x.contains("drafter-0")
    });
    tui.keys("3");
    let screen = tui.wait_for("the phases view with the declared phases", |x| {
        ["anchors", "optim", "metrics", "forward"]
            .iter()
            .all(|p| x.contains(p))
    });
    for builtin in ["batch_wait", "grad_sync", "hs_pack", "h2d"] {
        assert!(!screen.contains(builtin), "{builtin} shown:\n{screen}");
    }
}

/// Names are values: two pipelines' snapshots in one process each render with their own stage
/// and phase names — headless lines, a snapshot file's lines read back, a Chrome trace — where a
/// table installed for the process would have named both alike.
#[test]
fn two_pipelines_snapshots_in_one_process_keep_their_own_names() {
    use dflash_top::telemetry::snapshot::{Snapshot, StepSpan, ThreadState, ThreadView};
    use dflash_top::telemetry::stages::{StageDecl, StageTable};
    use dflash_top::telemetry::trace::write_trace;
    use dflash_top::telemetry::verdict::Verdict;
    use dflash_top::telemetry::Role;
    use std::sync::Arc;
    let pipeline = |consumer: &str, work: &str| {
        let table = StageTable {
            stages: vec![
                StageDecl {
                    name: "source".into(),
                    phases: vec!["push_wait".into()],
                },
                StageDecl {
                    name: consumer.into(),
                    phases: vec!["pop_wait".into(), work.into()],
                },
            ],
        };
        let (names, roles) = table.resolve().unwrap();
        let work = names.phases(roles[1])[1];
        let mut w = dflash_top::telemetry::snapshot::PhaseWindow {
            steps: 4,
            wall_ns: 40_000_000,
            phase_steps: 4.0,
            span_ns: 1_000_000_000,
            ..Default::default()
        };
        w.phase_ns[work.index()] = 40_000_000;
        Snapshot {
            verdict: Verdict::Blocked(1),
            threads: vec![ThreadView {
                name: format!("{consumer}-0"),
                role: roles[1],
                device: "cpu".into(),
                tid: 1,
                cpu_pct: None,
                phase: work,
                phase_s: 0.5,
                state: ThreadState::Working,
                os_state: None,
                w1: w,
                w10: w,
                run: w,
                sizes: None,
            }],
            steps: vec![StepSpan {
                thread: format!("{consumer}-0"),
                role: roles[1],
                end_ns: 10_000_000,
                wall_ns: 10_000_000,
                phases: vec![(work, 10_000_000)],
            }],
            names: Arc::new(names),
            ..Snapshot::default()
        }
    };
    let decode = pipeline("decode", "parse");
    let train = pipeline("train", "fit");
    // The same role and phase slot in both, each named by its own pipeline.
    assert_eq!(decode.threads[0].role, train.threads[0].role);
    assert_eq!(decode.threads[0].phase, train.threads[0].phase);
    let line = |s: &Snapshot| dflash_top::headless::interval_line(s);
    assert!(line(&decode).contains(" | decode-0 step_ms=10.0 pop_wait_ms=0.0 parse_ms=10.0"));
    assert!(
        line(&decode).contains("verdict=decode-bound"),
        "{}",
        line(&decode)
    );
    assert!(line(&train).contains(" | train-0 step_ms=10.0 pop_wait_ms=0.0 fit_ms=10.0"));
    assert!(
        line(&train).contains("verdict=train-bound"),
        "{}",
        line(&train)
    );
    // A snapshot file keeps the names; our own pipeline's snapshots are written as before.
    let back: Snapshot = serde_json::from_str(&serde_json::to_string(&train).unwrap()).unwrap();
    assert_eq!(back.names, train.names);
    let ours = serde_json::to_string(&Snapshot::default()).unwrap();
    assert!(!ours.contains("\"names\""), "{ours}");
    // Each trace names its slices by its own pipeline.
    let dir = tempfile::tempdir().unwrap();
    for (s, slice) in [(&decode, "\"parse\""), (&train, "\"fit\"")] {
        let path = dir.path().join("t.json");
        write_trace(&path, &s.steps, &s.names).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(slice), "{text}");
        assert!(text.contains(&format!("\"cat\":\"{}\"", s.names.role(Role::Stage(1)))));
    }
}
