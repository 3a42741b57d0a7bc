//! Attach and detach: the socket a run serves (private, same-uid only), viewers that come and
//! go while the run goes on, a viewer that reads nothing, two at once, a protocol version
//! mismatch, recordings, and the Python client's example pipeline under `attach --headless`.

use crate::support::{bin, repo, wait_until};
use dflash_top::cancel::CancelToken;
use dflash_top::telemetry::{Phase, Role, Telemetry};
use dflash_top::wire::fanout::Fanout;
use dflash_top::wire::join::Attached;
use dflash_top::wire::protocol::*;
use dflash_top::wire::serve::{fd_room, open_file_limit, peer_allowed, ServeLimits, Server};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A pipeline of one scripted worker, served on a socket in a temp dir: the hub, the fan-out and
/// the server of `train`, without libtorch.
struct Scripted {
    telemetry: Telemetry,
    server: Option<Server>,
    steps: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
    hub_cancel: CancelToken,
    hub: Option<std::thread::JoinHandle<()>>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Scripted {
    fn start() -> Scripted {
        Self::start_with(ServeLimits::default())
    }

    fn start_with(limits: ServeLimits) -> Scripted {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions").join("run.sock");
        let mut telemetry = Telemetry::new();
        telemetry.probes = false;
        let fanout = Fanout::tap(&telemetry, false, None);
        let server = Server::start_with(&fanout, &telemetry, &path, limits).unwrap();
        let steps = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let worker = {
            let (sink, steps, stop) = (telemetry.sink().clone(), steps.clone(), stop.clone());
            std::thread::Builder::new()
                .name("drafter-0".into())
                .spawn(move || {
                    let mut rec = sink.recorder(Role::Drafter, "cpu");
                    while !stop.load(Relaxed) {
                        rec.mark(Phase::Forward);
                        std::thread::sleep(Duration::from_micros(300));
                        rec.mark(Phase::Backward);
                        rec.end_step(16, None);
                        steps.fetch_add(1, Relaxed);
                    }
                })
                .unwrap()
        };
        let hub_cancel = CancelToken::new();
        let hub = telemetry.spawn_hub(hub_cancel.clone()).unwrap();
        Scripted {
            telemetry,
            server: Some(server),
            steps,
            stop,
            worker: Some(worker),
            hub_cancel,
            hub: Some(hub),
            path,
            _dir: dir,
        }
    }

    fn steps(&self) -> u64 {
        self.steps.load(Relaxed)
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        self.hub_cancel.cancel();
        if let Some(h) = self.hub.take() {
            let _ = h.join();
        }
        if let Some(s) = self.server.take() {
            s.stop();
        }
        let _ = &self.telemetry;
    }
}

/// A raw client that has done the handshake.
fn raw_client(path: &Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    write_preamble(&mut s).unwrap();
    read_preamble(&mut s).unwrap();
    s
}

#[test]
fn the_socket_is_private_and_other_users_are_refused() {
    let run = Scripted::start();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&run.path), 0o600, "the socket is the user's alone");
    assert_eq!(
        mode(run.path.parent().unwrap()),
        0o700,
        "and so is its directory"
    );
    // The credential check itself, with a made-up peer.
    let e = peer_allowed(1001, 1000).unwrap_err();
    assert!(e.contains("uid 1000") && e.contains("uid 1001"), "{e}");
    assert!(peer_allowed(1000, 1000).is_ok());
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("not root: a real peer of another uid is not tried (the check above stands)");
        return;
    }
    // As root we can be another user for real: open the file modes up so that only the
    // SO_PEERCRED check stands between that user and the stream.
    let open = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    open(run.path.parent().unwrap(), 0o755).unwrap();
    open(&run.path, 0o666).unwrap();
    let mut s = std::os::unix::process::CommandExt::uid(&mut bin(), 65534)
        .args([
            "attach",
            run.path.to_str().unwrap(),
            "--headless",
            "--seconds",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = s.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(s.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "another uid was let in: {err}");
    assert!(
        err.contains("refused") && err.contains("uid 65534"),
        "the refusal says why: {err}"
    );
}

#[test]
fn a_viewer_that_reads_nothing_never_blocks_the_run() {
    let run = Scripted::start();
    let _silent = raw_client(&run.path);
    wait_until("the server to count the viewer", || {
        run.server.as_ref().unwrap().viewers() == 1
    });
    let before = run.steps();
    // The viewer reads nothing: its socket buffer and then its backlog fill, and frames are
    // dropped for it (counted) while the worker keeps stepping.
    wait_until("frames dropped for the silent viewer", || {
        run.server.as_ref().unwrap().frames_dropped() > 0
    });
    let at_drop = run.steps();
    wait_until("steps to go on after the viewer fell behind", || {
        run.steps() > at_drop + 200
    });
    assert!(run.steps() > before);
}

#[test]
fn two_viewers_at_once_and_the_run_goes_on_after_both_detach() {
    let run = Scripted::start();
    let a = Attached::join(&run.path).unwrap();
    let b = Attached::join(&run.path).unwrap();
    let (fa, fb) = (a.telemetry.subscribe(), b.telemetry.subscribe());
    for feed in [&fa, &fb] {
        let start = Instant::now();
        loop {
            let s = feed.recv_timeout(Duration::from_secs(60)).unwrap();
            let d = s.threads.iter().find(|t| t.name == "drafter-0");
            if d.is_some_and(|t| t.run.steps > 0) {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "no steps seen");
        }
    }
    assert_eq!(a.hello.pid, std::process::id());
    // A control key goes through the socket to the run's switches.
    a.telemetry
        .command(dflash_top::telemetry::HubCommand::SetProfiling(false));
    wait_until("profiling to go off in the run", || {
        !run.telemetry.switches().profiling()
    });
    a.detach();
    let after_one = run.steps();
    // The other viewer still sees the run advance.
    let seen = |feed: &crossbeam_channel::Receiver<Arc<dflash_top::telemetry::Snapshot>>| {
        feed.recv_timeout(Duration::from_secs(60))
            .unwrap()
            .threads
            .iter()
            .find(|t| t.name == "drafter-0")
            .map(|t| t.run.steps)
            .unwrap_or(0)
    };
    let first = seen(&fb);
    wait_until("the remaining viewer to see new steps", || {
        seen(&fb) > first
    });
    b.detach();
    wait_until("the run to go on with nobody attached", || {
        run.steps() > after_one + 100
    });
    wait_until("the server to let both viewers go", || {
        run.server.as_ref().unwrap().viewers() == 0
    });
}

#[test]
fn a_viewer_of_another_protocol_version_is_refused_with_a_sentence() {
    let run = Scripted::start();
    let mut s = UnixStream::connect(&run.path).unwrap();
    write_preamble_version(&mut s, VERSION + 1).unwrap();
    read_preamble(&mut s).unwrap();
    match read_msg(&mut s).unwrap() {
        Some(Msg::Refused { reason }) => assert!(
            reason.contains("version mismatch")
                && reason.contains(&format!("version {}", VERSION + 1)),
            "{reason}"
        ),
        other => panic!("expected a refusal, got {other:?}"),
    }
    // And a viewer told of another version by the producer says so too.
    let mut theirs = Vec::new();
    write_preamble_version(&mut theirs, 7).unwrap();
    let e = read_preamble(&mut &theirs[..]).unwrap_err().to_string();
    assert!(
        e.contains("version 7") && e.contains("same dflash-top release"),
        "{e}"
    );
}

/// The example pipeline, serving in `runtime` (its XDG_RUNTIME_DIR).
pub fn python_pipeline(runtime: &Path, slow: Option<&str>) -> Child {
    let mut c = Command::new(repo().join(".venv/bin/python"));
    c.arg(repo().join("python/examples/pipeline.py"))
        .args(["--no-torch", "--seconds", "120"])
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(s) = slow {
        c.args(["--slow", s]);
    }
    c.spawn().expect(".venv/bin/python runs (make venv)")
}

/// `attach PID --headless` on the example for a few seconds: its interval lines.
fn watch_python(slow: Option<&str>) -> Vec<String> {
    let runtime = tempfile::tempdir().unwrap();
    let mut child = python_pipeline(runtime.path(), slow);
    let sock =
        crate::support::served_socket("the Python pipeline's socket", runtime.path(), child.id());
    let o = crate::support::attach_headless(runtime.path(), child.id(), 8);
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(status.success(), "the pipeline stops cleanly on SIGTERM");
    assert!(!sock.exists(), "the pipeline removed its socket");
    assert!(err.contains("detached from PID"), "{err}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.starts_with("t="))
        .map(String::from)
        .collect()
}

#[test]
fn a_python_pipeline_shows_its_stages_and_queue_and_the_verdict_follows_a_slowed_stage() {
    let fast = watch_python(None);
    let slow = watch_python(Some("producer=300ms"));
    for lines in [&fast, &slow] {
        let last = lines.last().expect("interval lines");
        for part in [
            "| producer step_ms=",
            "make_ms=",
            "| consumer step_ms=",
            "forward_ms=",
            "| q.batches=",
        ] {
            assert!(last.contains(part), "{part} missing: {last}");
        }
    }
    // A thread's line lists the phases it entered: the slowed producer's consumer waits on the
    // queue, the fast one's producer waits to put.
    let wait = |lines: &[String], part: &str| lines.last().is_some_and(|l| l.contains(part));
    assert!(wait(&slow, "pop_wait_ms="), "{slow:?}");
    assert!(wait(&fast, "push_wait_ms="), "{fast:?}");
    let verdicts = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter_map(|l| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix("verdict="))
            })
            .map(String::from)
            .collect()
    };
    let (vf, vs) = (verdicts(&fast), verdicts(&slow));
    assert!(
        vs.iter().skip(2).all(|v| v == "producer-bound") && vs.len() > 3,
        "a slowed producer starves the consumer: {vs:?}"
    );
    assert!(
        !vf.iter().any(|v| v == "producer-bound")
            && vf.last().is_some_and(|v| v == "consumer-bound"),
        "unslowed, the consumer is the bottleneck: {vf:?}"
    );
}

/// Issue 28: a Python pipeline's `torch.cuda.memory_stats` figures (a stand-in torch: no GPU
/// here) cross the socket in its samples, and `attach --headless` prints them with their rate.
#[test]
fn a_python_pipelines_allocator_figures_reach_attach() {
    let runtime = tempfile::tempdir().unwrap();
    let mut child = Command::new(repo().join(".venv/bin/python"))
        .arg(repo().join("tests/fixtures/alloc_pipeline.py"))
        .args(["--seconds", "60"])
        .env("PYTHONPATH", repo().join("python"))
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect(".venv/bin/python runs (make venv)");
    crate::support::served_socket("the Python pipeline's socket", runtime.path(), child.id());
    let o = crate::support::attach_headless(runtime.path(), child.id(), 4);
    let _ = child.kill();
    let _ = child.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let last = out
        .lines()
        .rfind(|l| l.starts_with("t="))
        .expect("interval lines");
    assert!(
        last.contains(" | alloc0=3.0/13.0GiB alloc0.seg=42 alloc0.churn/s="),
        "{last}"
    );
    let churn: f64 = last
        .split_whitespace()
        .find_map(|w| w.strip_prefix("alloc0.churn/s="))
        .and_then(|v| v.parse().ok())
        .expect("a churn rate");
    // 4 allocations and frees a sample, ten samples a second.
    assert!((25.0..=55.0).contains(&churn), "{last}");
}

#[test]
fn a_recording_replays_through_a_hub() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.dft");
    let o = bin()
        .args(["train", "--headless", "--steps", "6", "--record"])
        .arg(&rec)
        .env("XDG_RUNTIME_DIR", dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let msgs = match dflash_top::wire::recording::read(&rec).unwrap() {
        dflash_top::wire::recording::Recording::Frames(m) => m,
        _ => panic!("this version records the frame stream"),
    };
    assert!(msgs.iter().any(|m| matches!(m, Msg::Sample(_))));
    // Played through the replay's hub to its end: the last snapshot is the run's last step.
    let mut sim = dflash_top::wire::replay::Sim::new(msgs).unwrap();
    let snaps = sim.play_to(sim.duration_s() + 1.0);
    assert!(sim.at_end());
    assert_eq!(snaps.last().map(|s| s.train.step), Some(6));
}

#[test]
fn the_tui_attaches_its_keys_reach_the_pipeline_and_q_detaches() {
    use crate::tmux::Session;
    let runtime = tempfile::tempdir().unwrap();
    let mut child = python_pipeline(runtime.path(), None);
    let pid = child.id().to_string();
    let sock =
        crate::support::served_socket("the Python pipeline's socket", runtime.path(), child.id());
    let cmd = format!(
        "XDG_RUNTIME_DIR={} {} attach {pid}; echo EXITED=$?; sleep 600",
        runtime.path().display(),
        env!("CARGO_BIN_EXE_dflash-top"),
    );
    let s = Session::start_sized(
        format!("dflash-attach-{}", std::process::id()),
        (120, 40),
        &cmd,
    );
    s.wait_for("the pipeline's threads and the attached note", |x| {
        x.contains("producer")
            && x.contains("consumer")
            && x.contains(&format!("attached to PID {pid} (python) since "))
            && x.contains("; q detaches")
    });
    // `p` goes through the socket: a second viewer reads profiling off from the pipeline.
    s.keys("p");
    wait_until("the pipeline to report profiling off", || {
        let o = bin()
            .args([
                "attach",
                &pid,
                "--headless",
                "--seconds",
                "2.5",
                "--interval",
                "1",
            ])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).contains("profiling=off")
    });
    // One `q` detaches (quitting stops nothing here), and the pipeline goes on.
    s.keys("q");
    let after = s.wait_for("the viewer to exit", |x| x.contains("EXITED="));
    assert!(after.contains("EXITED=0"), "{after}");
    assert!(
        child.try_wait().unwrap().is_none(),
        "the pipeline ended with the viewer"
    );
    assert!(sock.exists(), "the pipeline still serves");
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

#[test]
fn a_headless_train_is_watched_and_left_and_finishes_its_steps() {
    let runtime = tempfile::tempdir().unwrap();
    let train = bin()
        // Paced (a batch each 250 ms: at least 10 s of steps) so that on a loaded machine the
        // viewer below still starts, is listed and sees steps before the run's last one.
        .args(["train", "--headless", "--steps", "40", "--interval", "60"])
        .args(["--slow", "loader=250ms"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = crate::support::served_socket("the run's socket", runtime.path(), train.id());
    // `attach --list`: a row per session under its columns, the viewers counted.
    let list = || {
        let o = bin()
            .args(["attach", "--list"])
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let row = |text: &str| -> Vec<String> {
        let pid = train.id().to_string();
        text.lines()
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .find(|w| w.first() == Some(&pid))
            .unwrap_or_else(|| panic!("no row for {pid}: {text}"))
    };
    // `attach` with no target joins the only session.
    let viewer = bin()
        .args(["attach", "--headless", "--seconds", "4", "--interval", "1"])
        .env("XDG_RUNTIME_DIR", runtime.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = train.id().to_string();
    // The listing that counted the viewer is the one read below: a short run may have ended
    // by the time another is asked for.
    let seen = std::cell::RefCell::new(String::new());
    wait_until("--list to count the viewer", || {
        let t = list();
        let counted = t.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.first() == Some(&pid.as_str()) && w.get(5) == Some(&"1")
        });
        if counted {
            *seen.borrow_mut() = t;
        }
        counted
    });
    let text = seen.into_inner();
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["PID", "COMMAND", "STARTED", "STEPS", "TOK/S", "VIEWERS", "SOCKET"],
        "{text}"
    );
    let r = row(&text);
    assert_eq!(r[1], "dflash-top", "{text}");
    let hms: Vec<&str> = r[2].split(':').collect();
    assert!(
        hms.len() == 3 && hms.iter().all(|p| p.len() == 2 && p.parse::<u8>().is_ok()),
        "the start time: {text}"
    );
    assert!(r[3].parse::<u64>().is_ok(), "steps: {text}");
    assert!(r[4] != "–", "tok/s: {text}");
    assert_eq!(r[6], sock.display().to_string(), "{text}");
    let o = viewer.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let last = out.lines().rfind(|l| l.starts_with("t=")).expect("lines");
    for part in [
        "| loader",
        "| target-0",
        "| drafter-0",
        "| q.batch=",
        "| q.hs=",
        "verdict=",
    ] {
        assert!(last.contains(part), "{part} missing: {last}");
    }
    // Issue 28: the drafter's host syncs cross the socket (one a step, in metrics).
    let drafter_syncs = |l: &str| {
        let d = l.split(" | ").find(|p| p.starts_with("drafter-0 "))?;
        super::support::field(d, "metrics_syncs")
    };
    assert!(
        out.lines().any(|l| drafter_syncs(l) == Some(1.0)),
        "no drafter-0 metrics_syncs=1.0: {out}"
    );
    // Detached: the run goes on to its last step and removes its socket.
    let done = train.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(out.contains("attach: dflash-top attach"), "{out}");
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert!(summary.contains("step=40 "), "{summary}");
    assert!(!sock.exists(), "the socket is removed at the end");
}

/// Issue 24: the socket can neither stop the run nor lock others out.
mod limits {
    use super::*;
    use dflash_top::telemetry::HubCommand;

    fn server(run: &Scripted) -> &Server {
        run.server.as_ref().unwrap()
    }

    fn send(s: &mut UnixStream, cmd: HubCommand) {
        write_msg(s, &Msg::Command { cmd }).unwrap();
    }

    /// Reads frames until a status line containing `what` (panics at the end of the stream).
    fn status_containing(s: &mut UnixStream, what: &str) -> String {
        loop {
            match read_msg(s).unwrap() {
                Some(Msg::Status { text }) if text.contains(what) => return text,
                Some(_) => {}
                None => panic!("the stream ended before a status with `{what}`"),
            }
        }
    }

    #[test]
    fn viewers_are_capped_and_the_next_is_refused_with_a_sentence() {
        let run = Scripted::start_with(ServeLimits {
            max_viewers: 2,
            ..ServeLimits::default()
        });
        let a = Attached::join(&run.path).unwrap();
        let b = Attached::join(&run.path).unwrap();
        let e = format!(
            "{:#}",
            Attached::join(&run.path).err().expect("a third is refused")
        );
        assert!(
            e.contains("refused") && e.contains("allows 2") && e.contains("--max-viewers"),
            "{e}"
        );
        assert_eq!(server(&run).viewers_refused(), 1);
        let before = run.steps();
        wait_until("the run to go on", || run.steps() > before + 50);
        // One leaves: a place is free again.
        a.detach();
        wait_until("the server to let the viewer go", || {
            server(&run).viewers() == 1
        });
        let c = Attached::join(&run.path).expect("a place freed by a viewer that left");
        c.detach();
        b.detach();
    }

    #[test]
    fn silent_connections_hold_up_no_other_viewer_and_time_out() {
        // Deadline long enough that only a handshake off the accept path lets the viewer in.
        let run = Scripted::start_with(ServeLimits {
            max_viewers: 32,
            handshake: Duration::from_secs(3600),
            ..ServeLimits::default()
        });
        let silent: Vec<UnixStream> = (0..15)
            .map(|_| UnixStream::connect(&run.path).unwrap())
            .collect();
        let v = Attached::join(&run.path).expect("a viewer joins past 15 silent connections");
        assert_eq!(v.hello.pid, std::process::id());
        v.detach();
        drop(silent);
        // With a short deadline a silent connection is told why it is dropped.
        let run = Scripted::start_with(ServeLimits {
            handshake: Duration::from_millis(200),
            ..ServeLimits::default()
        });
        let mut s = UnixStream::connect(&run.path).unwrap();
        read_preamble(&mut s).unwrap();
        match read_msg(&mut s).unwrap() {
            Some(Msg::Refused { reason }) => {
                assert!(reason.contains("no handshake within"), "{reason}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_viewer_that_paused_and_left_un_pauses_the_run() {
        let run = Scripted::start();
        let mut v = raw_client(&run.path);
        send(&mut v, HubCommand::SetPaused(true));
        wait_until("the run to pause", || run.telemetry.switches().paused());
        // A second viewer that did not pause comes and goes: the pause stays.
        let w = Attached::join(&run.path).unwrap();
        w.detach();
        wait_until("the second viewer to be let go", || {
            server(&run).viewers() == 1
        });
        assert!(
            run.telemetry.switches().paused(),
            "another viewer's leaving un-paused it"
        );
        drop(v);
        wait_until("the run to resume after the viewer left", || {
            !run.telemetry.switches().paused()
        });
    }

    #[test]
    fn checkpoint_requests_from_viewers_are_rate_limited() {
        let run = Scripted::start_with(ServeLimits {
            checkpoint_every: Duration::from_secs(3600),
            ..ServeLimits::default()
        });
        let mut v = raw_client(&run.path);
        for _ in 0..50 {
            send(&mut v, HubCommand::Checkpoint);
        }
        wait_until("every request to be judged", || {
            let (taken, refused) = server(&run).checkpoint_requests();
            taken + refused == 50
        });
        assert_eq!(server(&run).checkpoint_requests(), (1, 49));
        let note = status_containing(&mut v, "checkpoint not taken");
        assert!(note.contains("once every 3600 s"), "{note}");
    }

    #[test]
    fn a_viewer_is_refused_when_it_would_eat_into_the_reserved_file_descriptors() {
        let e = fd_room(900, 1024, 128).unwrap_err();
        assert!(
            e.contains("900 of its 1024") && e.contains("ulimit -n"),
            "{e}"
        );
        assert!(fd_room(100, 1024, 128).is_ok());
        let Some(limit) = open_file_limit() else {
            eprintln!("no open-file limit: the refusal near it is not tried");
            return;
        };
        // A reserve as large as the limit: every viewer would eat into it.
        let run = Scripted::start_with(ServeLimits {
            fd_reserve: limit,
            ..ServeLimits::default()
        });
        let e = format!("{:#}", Attached::join(&run.path).err().expect("refused"));
        assert!(e.contains("open files") && e.contains("checkpoints"), "{e}");
        let before = run.steps();
        wait_until("the run to go on", || run.steps() > before + 50);
    }
}

/// Issue 30: a session that names another host in its hello (what a socket forwarded with
/// `ssh -L` brings; `host:far` makes one here) is watched as that host's: the viewer says so,
/// and its lines flow (its clock moved onto ours by its first sample).
#[test]
fn a_session_of_another_host_is_named_so_and_watched() {
    let runtime = tempfile::tempdir().unwrap();
    let mut child = crate::support::endless_train(runtime.path(), 5)
        .env("DFLASH_TOP_FAULT", "host:far")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    crate::support::served_socket("the far session's socket", runtime.path(), child.id());
    let o = crate::support::attach_headless(runtime.path(), child.id(), 3);
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let first = out.lines().next().unwrap_or_default();
    let want = format!("attached to PID {} on far (dflash-top, ", child.id());
    assert!(first.starts_with(&want), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("t=") && l.contains("drafter-0 step_ms=")),
        "{out}"
    );
}
