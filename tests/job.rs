//! Jobs of several processes on the CPU (libtorch's TCPStore and Gloo): real `dflash-top`
//! processes given torchrun's variables (and torchrun itself), as a user launches them.

use crate::support::{bin, free_port, repo, wait_until, wait_within};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Rank `rank` of `world` with `args`, its output into `dir/rR.out` and `dir/rR.err`.
fn rank(dir: &Path, port: u16, world: u32, rank: u32, args: &[&str]) -> Child {
    rank_with(dir, port, world, rank, args, &[])
}

/// `rank` with more variables in its environment.
fn rank_with(
    dir: &Path,
    port: u16,
    world: u32,
    rank: u32,
    args: &[&str],
    vars: &[(&str, &str)],
) -> Child {
    let out = std::fs::File::create(dir.join(format!("r{rank}.out"))).unwrap();
    let err = std::fs::File::create(dir.join(format!("r{rank}.err"))).unwrap();
    bin()
        .args(args)
        .current_dir(dir)
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env_remove("TORCHELASTIC_RUN_ID")
        .env_remove("TORCHELASTIC_USE_AGENT_STORE")
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap()
}

fn read(dir: &Path, rank: u32, which: &str) -> String {
    std::fs::read_to_string(dir.join(format!("r{rank}.{which}"))).unwrap_or_default()
}

/// Every rank of a job with the same `args`; each one's exit status.
fn run_job(dir: &Path, world: u32, args: &[&str]) -> Vec<std::process::ExitStatus> {
    let port = free_port();
    let mut children: Vec<Child> = (0..world)
        .map(|r| rank(dir, port, world, r, args))
        .collect();
    children
        .iter_mut()
        .enumerate()
        .map(|(r, c)| wait_within(c, Duration::from_secs(600), &format!("rank {r}")))
        .collect()
}

/// Two ranks of `train --headless --steps STEPS --save-every 2 --save-dir ckptR` (a directory
/// each) and `extra`, both to their end; each one's output, after asserting it succeeded.
fn train_two_ranks(dir: &Path, steps: &str, extra: &[&str]) -> Vec<String> {
    let port = free_port();
    let mut children: Vec<Child> = (0..2)
        .map(|r| {
            let save = format!("ckpt{r}");
            let args = ["train", "--headless", "--steps", steps, "--save-every", "2"];
            let args = [&args[..], &["--save-dir", &save], extra].concat();
            rank(dir, port, 2, r, &args)
        })
        .collect();
    let mut outs = Vec::new();
    for (r, c) in children.iter_mut().enumerate() {
        let status = wait_within(c, Duration::from_secs(300), "a training rank");
        let out = read(dir, r as u32, "out");
        assert!(
            status.success(),
            "rank {r}: {out}{}",
            read(dir, r as u32, "err")
        );
        outs.push(out);
    }
    outs
}

/// The checkpoints (`step-N`) in `dir`, sorted.
fn steps_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|it| {
            it.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("step-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `bench replicas`' per-step lines: (replicas' mean loss, single drafter's loss) as printed.
fn loss_lines(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| l.contains(" loss replicas="))
        .map(|l| {
            let value = |key: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .unwrap()
                    .to_string()
            };
            (value("replicas="), value("single="))
        })
        .collect()
}

fn in_process_replicas(devices: &str, steps: &str) -> Output {
    bin()
        .args([
            "bench",
            "replicas",
            "--steps",
            steps,
            "--drafter-devices",
            devices,
        ])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap()
}

/// Replicas in 2 and in 4 processes, and 2 processes of 2 replicas each, end bitwise equal, and
/// take the same steps as the replicas of one process (`bench replicas` with as many CPU
/// drafters), which follow one drafter with all the rows: the same losses to the printed digit,
/// the same distance to that drafter.
#[test]
fn ranks_stay_bitwise_equal_and_match_one_process_with_all_the_rows() {
    let cases = [
        (2u32, "cpu", "cpu,cpu"),
        (4, "cpu", "cpu,cpu,cpu,cpu"),
        (2, "cpu,cpu", "cpu,cpu,cpu,cpu"),
    ];
    for (world, each, devices) in cases {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "bench",
            "replicas",
            "--steps",
            "2",
            "--drafter-devices",
            each,
        ];
        let status = run_job(dir.path(), world, &args);
        let one = in_process_replicas(devices, "2");
        assert!(
            one.status.success(),
            "{}",
            String::from_utf8_lossy(&one.stderr)
        );
        let one_out = String::from_utf8_lossy(&one.stdout);
        let want = loss_lines(&one_out);
        assert_eq!(want.len(), 2);
        let to_single = |text: &str, key: &str| -> String {
            let at = text
                .find(key)
                .unwrap_or_else(|| panic!("no `{key}` in {text}"));
            text[at + key.len()..]
                .split_whitespace()
                .next()
                .unwrap()
                .to_string()
        };
        let want_single = to_single(&one_out, "max |w0 - w_single| = ");
        for r in 0..world {
            let out = read(dir.path(), r, "out");
            assert!(
                status[r as usize].success(),
                "rank {r} of {world}: {out}{}",
                read(dir.path(), r, "err")
            );
            assert!(
                out.contains(&format!(
                    "identical to rank 0 after 2 steps: yes (max |w0 - w{r}| = 0e0)"
                )),
                "rank {r} of {world} ({each}) is bitwise rank 0's: {out}"
            );
            assert_eq!(
                loss_lines(&out),
                want,
                "rank {r} of {world} ({each}): the job's steps are one process's"
            );
            assert_eq!(
                to_single(&out, &format!("max |w{r} - w_single| = ")),
                want_single,
                "rank {r} of {world} ({each}): as far from one drafter as one process's replicas"
            );
        }
    }
}

/// Two ranks of two replicas each train as one job of four: every replica takes a batch a
/// step, only the job's replica 0 writes the checkpoints and the others wait for it; a rank
/// started with another number of replicas is refused at the rendezvous, naming the field.
#[test]
fn ranks_of_two_replicas_each_train_as_one_job_and_another_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let outs = train_two_ranks(dir.path(), "4", &["--drafter-devices", "cpu,cpu"]);
    let one = bin()
        .args(["train", "--headless", "--steps", "4"])
        .current_dir(dir.path())
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .output()
        .unwrap();
    assert!(one.status.success());
    let tokens = |text: &str| -> u64 {
        let summary = text.lines().find(|l| l.starts_with("summary:")).unwrap();
        summary
            .split_whitespace()
            .find_map(|w| w.strip_prefix("tokens="))
            .unwrap()
            .parse()
            .unwrap()
    };
    let single = tokens(&String::from_utf8_lossy(&one.stdout));
    for (r, out) in outs.iter().enumerate() {
        assert!(out.contains("summary: step=4 "), "rank {r}: {out}");
        // Its `config:` line names the job's replicas it trains.
        let config = out.lines().find(|l| l.starts_with("config: ")).unwrap();
        let replicas = format!(" replicas={}-{}", 2 * r, 2 * r + 1);
        assert!(config.ends_with(&replicas), "rank {r}: {config}");
        assert_eq!(
            tokens(out),
            2 * single,
            "rank {r}'s two replicas each trained a batch a step: {out}"
        );
    }
    assert_eq!(
        steps_in(&dir.path().join("ckpt0")),
        vec!["step-000002", "step-000004"],
        "the job's replica 0 saved each"
    );
    assert!(
        steps_in(&dir.path().join("ckpt1")).is_empty(),
        "rank 1 writes none"
    );

    let port = free_port();
    let base = ["train", "--headless", "--steps", "3"];
    let two = [&base[..], &["--drafter-devices", "cpu,cpu"]].concat();
    let mut r0 = rank(dir.path(), port, 2, 0, &two);
    let mut r1 = rank(dir.path(), port, 2, 1, &base);
    for (r, c) in [(0, &mut r0), (1, &mut r1)] {
        let status = wait_within(c, Duration::from_secs(120), "a refused rank");
        let err = read(dir.path(), r, "err");
        assert!(!status.success(), "rank {r} is refused");
        assert!(
            err.contains(
                "rank 1 was started with drafters_per_rank=1 but rank 0 with drafters_per_rank=2"
            ),
            "rank {r}: {err}"
        );
    }
}

/// Two ranks train, on different shards of the data; only rank 0 writes checkpoints (each rank
/// is given a directory of its own here), and a resumed job continues from rank 0's step on
/// every rank.
#[test]
fn two_ranks_train_rank_0_writes_the_checkpoints_and_the_job_resumes() {
    let dir = tempfile::tempdir().unwrap();
    train_two_ranks(dir.path(), "6", &[]);
    let steps_in = |d: &str| steps_in(&dir.path().join(d));
    assert_eq!(
        steps_in("ckpt0"),
        vec!["step-000002", "step-000004", "step-000006"],
        "rank 0 saved each"
    );
    assert!(steps_in("ckpt1").is_empty(), "rank 1 writes none");
    let loss = |r| {
        read(dir.path(), r, "out")
            .lines()
            .find(|l| l.starts_with("summary:"))
            .and_then(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with("loss="))
                    .map(String::from)
            })
            .unwrap()
    };
    assert_ne!(loss(0), loss(1), "the ranks train on different documents");

    let status = run_job(
        dir.path(),
        2,
        &[
            "train",
            "--headless",
            "--steps",
            "6",
            "--resume",
            "ckpt0/step-000004",
        ],
    );
    for r in 0..2 {
        let out = read(dir.path(), r, "out");
        assert!(
            status[r as usize].success(),
            "rank {r}: {}",
            read(dir.path(), r, "err")
        );
        assert!(
            out.contains("step=6 from_step=4"),
            "rank {r} resumed at 4: {out}"
        );
    }
}

/// Kills one rank of a running job: the other stops with a sentence naming it, within the
/// watch's bound (5 s of missed heartbeats; 10 s more at most for a worker held in a collective).
#[test]
fn a_killed_rank_stops_the_others_naming_it() {
    for victim in [1u32, 0] {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let args = ["train", "--headless", "--steps", "100000"];
        let mut children: Vec<Child> = (0..2)
            .map(|r| rank(dir.path(), port, 2, r, &args))
            .collect();
        wait_until("both ranks train", || {
            (0..2).all(|r| {
                read(dir.path(), r, "out")
                    .lines()
                    .any(|l| l.starts_with("t="))
            })
        });
        children[victim as usize].kill().unwrap();
        let killed = Instant::now();
        let survivor = 1 - victim as usize;
        let status = wait_within(
            &mut children[survivor],
            Duration::from_secs(60),
            "the surviving rank",
        );
        let took = killed.elapsed();
        let _ = children[victim as usize].wait();
        let err = read(dir.path(), survivor as u32, "err");
        assert!(!status.success(), "the survivor fails: {err}");
        assert!(
            err.contains(&format!("rank {victim}")),
            "it names rank {victim}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            took < Duration::from_secs(30),
            "it stopped {took:?} after the kill"
        );
    }
}

/// A rank whose worker fails tells the others at once: they stop with its sentence.
#[test]
fn a_failing_rank_stops_the_others_with_its_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["train", "--headless", "--steps", "100000"];
    let mut r0 = rank(dir.path(), port, 2, 0, &args);
    let fault = [("DFLASH_TOP_FAULT", "error:drafter")];
    let mut r1 = rank_with(dir.path(), port, 2, 1, &args, &fault);
    let s1 = wait_within(&mut r1, Duration::from_secs(120), "the failing rank");
    let s0 = wait_within(&mut r0, Duration::from_secs(60), "the other rank");
    let err0 = read(dir.path(), 0, "err");
    assert!(!s1.success() && !s0.success(), "both fail: {err0}");
    assert!(
        err0.contains("rank 1 failed: drafter-0 failed in phase")
            && err0.contains("injected error"),
        "rank 0 names rank 1 and its error: {err0}"
    );
}

/// A rank started with another recipe is refused at the rendezvous, on every rank, before any
/// collective; a malformed launcher variable is a sentence naming it.
#[test]
fn a_rank_with_a_different_config_is_refused_and_bad_variables_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = ["train", "--headless", "--steps", "3"];
    let mut r0 = rank(dir.path(), port, 2, 0, &base);
    let mut r1 = rank(
        dir.path(),
        port,
        2,
        1,
        &[&base[..], &["--seed", "3"]].concat(),
    );
    for (r, c) in [(0, &mut r0), (1, &mut r1)] {
        let status = wait_within(c, Duration::from_secs(120), "a refused rank");
        let err = read(dir.path(), r, "err");
        assert!(!status.success(), "rank {r} is refused");
        assert!(
            err.contains("rank 1 was started with seed=3 but rank 0 with seed=0"),
            "rank {r}: {err}"
        );
    }

    let out = bin()
        .args(["train", "--headless", "--steps", "1"])
        .env("RANK", "2")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", "29500")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("RANK=2 is not below WORLD_SIZE=2"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `torchrun --no-python dflash-top train ...` just works: torchrun's agent hosts the store.
#[test]
fn torchrun_launches_a_job() {
    let torchrun: PathBuf = repo().join(".venv/bin/torchrun");
    if !torchrun.exists() {
        panic!(
            "{} is missing: `make test` installs torch into .venv",
            torchrun.display()
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(&torchrun)
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            &free_port().to_string(),
            "--no-python",
            env!("CARGO_BIN_EXE_dflash-top"),
            "train",
            "--headless",
            "--steps",
            "3",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("summary: step=3").count(),
        2,
        "both ranks trained 3 steps: {text}"
    );
}

/// A tmux session (wide: a summary in one line) running two ranks of a job without `--headless`
/// in `dir` (batches of 2 rows of 256 tokens): rank 1 in the background with `r1_env` set, rank 0
/// in front, then each one's exit status (`EXIT0=`, `EXIT1=`).
fn ranks_in_one_terminal(dir: &Path, r1_env: &str) -> crate::tmux::Session {
    const ARGS: &str = "--batch 2 --seq-len 256";
    let d = dir.display();
    let exe = env!("CARGO_BIN_EXE_dflash-top");
    let cmd = format!(
        "cd {d}; export XDG_RUNTIME_DIR={d} MASTER_ADDR=127.0.0.1 MASTER_PORT={} WORLD_SIZE=2; \
         unset TORCHELASTIC_RUN_ID TORCHELASTIC_USE_AGENT_STORE; \
         RANK=1 LOCAL_RANK=1 {r1_env} {exe} train {ARGS} --save-dir ckpt1 & \
         RANK=0 LOCAL_RANK=0 {exe} train {ARGS} --save-dir ckpt0; echo EXIT0=$?; \
         wait $!; echo EXIT1=$?; sleep 600",
        free_port()
    );
    let name = format!("dflash-job-{}-{}", std::process::id(), r1_env.len());
    crate::tmux::Session::start_sized(name, (220, 45), &cmd)
}

/// The ranks of a job started in one terminal, as torchrun starts them, share it: LOCAL_RANK 0
/// draws every rank of the host on one screen and the others write nothing there; a key reaches
/// every rank, `q` (twice) stops the job at one step, rank 0 saves it, both exit 0 and the
/// terminal is given back.
#[test]
fn the_ranks_in_one_terminal_share_one_screen_and_q_stops_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let s = ranks_in_one_terminal(dir.path(), "");
    let screen = s.wait_for("both ranks on rank 0's screen", |x| {
        x.contains("r0/drafter-0")
            && x.contains("r1/drafter-0")
            && x.contains("on this screen: r0 PID")
            && x.contains("q stops the job")
    });
    // The header says which rank draws it, in its `config:` line's words (issue 44).
    assert!(
        screen.contains(" rank=0/2 local_rank=0; on this screen: r0 PID"),
        "{screen}"
    );
    assert_eq!(s.display("#{alternate_on}"), "1", "{screen}");
    let r1_pid = screen
        .split("r1 PID ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .expect("rank 1's PID on the screen")
        .to_string();
    // `p` reaches rank 1 too: a viewer of rank 1 alone reads profiling off.
    s.keys("p");
    wait_until("rank 1 to report profiling off", || {
        let o = bin()
            .args(["attach", &r1_pid, "--headless", "--seconds", "2.5"])
            .args(["--interval", "1"])
            .env("XDG_RUNTIME_DIR", dir.path())
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).contains("profiling=off")
    });
    s.keys("q");
    s.wait_for("the stop to be asked again", |x| {
        x.contains("q again to stop")
    });
    s.keys("q");
    let after = s.wait_for("both ranks to exit", |x| x.contains("EXIT1="));
    assert!(
        after.contains("EXIT0=0") && after.contains("EXIT1=0"),
        "{after}"
    );
    assert_eq!(s.display("#{alternate_on}"), "0", "the terminal is back");
    // Nothing but rank 0's summary of the job reached the terminal.
    let printed: Vec<&str> = after.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(printed.len(), 3, "{after}");
    assert!(printed[0].starts_with("summary: step="), "{after}");
    let field = |key: &str| -> u64 {
        printed[0]
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {after}"))
    };
    let step = field("step=");
    assert_eq!(
        field("tokens="),
        2 * step * 2 * 256,
        "both ranks took every step to the one they stopped at: {after}"
    );
    assert_eq!(
        steps_in(&dir.path().join("ckpt0")),
        vec![format!("step-{step:06}")],
        "rank 0 saved the step the job stopped at: {after}"
    );
    assert!(steps_in(&dir.path().join("ckpt1")).is_empty());
}

/// Under torchrun (its agent hosts the store, LOCAL_WORLD_SIZE set) the ranks share one screen
/// too, and `q` twice ends the job: torchrun exits 0 with the terminal given back.
#[test]
fn torchrun_s_ranks_share_one_screen() {
    let torchrun: PathBuf = repo().join(".venv/bin/torchrun");
    assert!(torchrun.exists(), "`make test` installs torch into .venv");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let cmd = format!(
        "cd {d}; export XDG_RUNTIME_DIR={d}; {} --nproc-per-node 2 --master-port {} --no-python \
         {} train; echo EXIT=$?; sleep 600",
        torchrun.display(),
        free_port(),
        env!("CARGO_BIN_EXE_dflash-top")
    );
    let name = format!("dflash-torchrun-{}", std::process::id());
    let s = crate::tmux::Session::start_sized(name, (220, 45), &cmd);
    s.wait_for("both ranks on one screen", |x| {
        x.contains("r0/drafter-0") && x.contains("r1/drafter-0") && x.contains("q stops the job")
    });
    s.keys("q");
    s.wait_for("the stop to be asked again", |x| {
        x.contains("q again to stop")
    });
    s.keys("q");
    let after = s.wait_for("torchrun to exit", |x| x.contains("EXIT="));
    assert!(after.contains("EXIT=0"), "{after}");
    assert_eq!(after.matches("summary: step=").count(), 1, "{after}");
    assert_eq!(s.display("#{alternate_on}"), "0", "the terminal is back");
}

/// A rank that fails while its host's screen is up keeps its sentence until the screen has given
/// the terminal back (the screen names the failure meanwhile, unscrolled); then both say it.
#[test]
fn a_failing_rank_waits_for_the_screen_to_leave_before_it_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let s = ranks_in_one_terminal(dir.path(), "DFLASH_TOP_FAULT=error:drafter");
    let screen = s.wait_for("the screen to name the failed rank", |x| {
        x.contains("stopped: rank 1 failed") && x.contains("FINISHED")
    });
    assert!(
        screen.starts_with("dflash-top step"),
        "the header is still the first line: {screen}"
    );
    assert!(!screen.contains("dflash-top: "), "{screen}");
    s.keys("q");
    let after = s.wait_for("both ranks to exit", |x| x.contains("EXIT1="));
    assert!(
        after.contains("EXIT0=1") && after.contains("EXIT1=1"),
        "{after}"
    );
    assert!(
        after.contains("dflash-top: rank 1: drafter-0 failed in phase `forward`: injected error"),
        "rank 1 says why, naming itself: {after}"
    );
    assert!(
        after.contains("dflash-top: rank 1 failed: drafter-0 failed in phase"),
        "rank 0 says why it stopped: {after}"
    );
}

/// With no screen on the host (LOCAL_RANK 0 runs `--headless`), a rank started without
/// `--headless` keeps off the terminal yet says at once, naming itself, why it failed.
#[test]
fn a_quiet_rank_with_no_screen_says_at_once_why_it_failed() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = ["train", "--headless", "--steps", "100000"];
    let mut r0 = rank(dir.path(), port, 2, 0, &args);
    let fault = [("DFLASH_TOP_FAULT", "error:drafter")];
    let mut r1 = rank_with(
        dir.path(),
        port,
        2,
        1,
        &["train", "--steps", "100000"],
        &fault,
    );
    let s1 = wait_within(&mut r1, Duration::from_secs(120), "the failing quiet rank");
    let s0 = wait_within(&mut r0, Duration::from_secs(60), "the headless rank");
    let (out1, err1) = (read(dir.path(), 1, "out"), read(dir.path(), 1, "err"));
    assert!(!s1.success() && !s0.success(), "{err1}");
    assert!(out1.is_empty(), "the quiet rank printed nothing: {out1}");
    assert!(
        err1.contains("dflash-top: rank 1: drafter-0 failed in phase"),
        "{err1}"
    );
}

/// The value of `key=` in `line` (the first such field).
fn value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|w| w.strip_prefix(key))
}

/// Issue 44: two ranks started by hand, a healthy job of 20 steps with `--save-dir`: every
/// headless line of a rank names it (`config:` the job, rank and local rank; each interval line
/// and the `summary:` the rank), rank 0's summary adds the job's totals from both ranks'
/// figures, and neither rank writes a flight dump.
#[test]
fn a_ranks_lines_name_it_rank_0_sums_the_job_and_a_healthy_job_dumps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut children: Vec<Child> = (0..2)
        .map(|r| {
            let save = format!("ck{r}");
            let args = ["train", "--headless", "--steps", "20", "--save-every", "10"];
            let args = [&args[..], &["--save-dir", &save, "--interval", "0.5"]].concat();
            rank(dir.path(), port, 2, r, &args)
        })
        .collect();
    let mut outs = Vec::new();
    for (r, c) in children.iter_mut().enumerate() {
        let status = wait_within(c, Duration::from_secs(300), "a training rank");
        let (out, err) = (
            read(dir.path(), r as u32, "out"),
            read(dir.path(), r as u32, "err"),
        );
        assert!(status.success(), "rank {r}: {out}{err}");
        outs.push(out);
    }
    let summary = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("summary: "))
            .unwrap()
            .to_string()
    };
    let tokens = |line: &str| -> u64 { value(line, "tokens=").unwrap().parse().unwrap() };
    for (r, out) in outs.iter().enumerate() {
        let config = out.lines().find(|l| l.starts_with("config: ")).unwrap();
        assert!(
            config.ends_with(&format!(" job=127.0.0.1:{port} rank={r}/2 local_rank={r}")),
            "rank {r}: {config}"
        );
        let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
        assert!(!lines.is_empty(), "rank {r}: {out}");
        for l in &lines {
            assert!(l.contains(&format!(" rank={r}/2 | ")), "rank {r}: {l}");
        }
        let s = summary(out);
        assert!(s.starts_with("summary: step=20 "), "rank {r}: {s}");
        assert_eq!(value(&s, "rank="), Some(&*format!("{r}/2")), "{s}");
        // A healthy run dumps nothing: no `flight:` line, no flight directory.
        assert!(!out.contains("flight: "), "rank {r}: {out}");
        assert!(
            !dir.path().join(format!("ck{r}")).join("flight").exists(),
            "rank {r} made a flight directory"
        );
    }
    let (s0, s1) = (summary(&outs[0]), summary(&outs[1]));
    assert!(!s1.contains("job."), "only rank 0 sums the job: {s1}");
    assert_eq!(value(&s0, "job.ranks="), Some("2/2"), "{s0}");
    assert_eq!(
        value(&s0, "job.tokens=").unwrap().parse::<u64>().unwrap(),
        tokens(&s0) + tokens(&s1),
        "the job's tokens are both ranks': {s0} / {s1}"
    );
    let tok_s = |line: &str, key: &str| -> f64 { value(line, key).unwrap().parse().unwrap() };
    let summed = tok_s(&s0, "mean_tok/s=") + tok_s(&s1, "mean_tok/s=");
    assert!(
        (tok_s(&s0, "job.mean_tok/s=") - summed).abs() <= 1.0,
        "tok/s summed: {s0} / {s1}"
    );
    // The slowest by tok/s (either where the printed figures tie).
    let (t0, t1) = (tok_s(&s0, "mean_tok/s="), tok_s(&s1, "mean_tok/s="));
    let slowest = value(&s0, "job.slowest=");
    match t0.total_cmp(&t1) {
        std::cmp::Ordering::Less => assert_eq!(slowest, Some("r0"), "{s0} / {s1}"),
        std::cmp::Ordering::Greater => assert_eq!(slowest, Some("r1"), "{s0} / {s1}"),
        std::cmp::Ordering::Equal => assert!(slowest.is_some(), "{s0}"),
    }
    assert!(!s0.contains("job.missing"), "{s0}");
    assert_eq!(
        steps_in(&dir.path().join("ck0")),
        vec!["step-000010", "step-000020"],
        "rank 0 saves"
    );
    assert!(
        steps_in(&dir.path().join("ck1")).is_empty(),
        "rank 1 does not"
    );
}

/// Issue 44: rank 0's totals wait a bounded time for the others' figures and say who did not
/// report: rank 1 started without `--headless` (a rank that keeps off the terminal, which
/// prints no summary) never reports, and rank 0's line names it and sums its own figures only.
#[test]
fn rank_0s_summary_names_a_rank_that_did_not_report_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let base = ["train", "--steps", "4"];
    let mut quiet = rank(dir.path(), port, 2, 1, &base);
    let mut headless = rank(
        dir.path(),
        port,
        2,
        0,
        &[&base[..], &["--headless"]].concat(),
    );
    let limit = Duration::from_secs(300);
    let s0 = wait_within(&mut headless, limit, "rank 0");
    let s1 = wait_within(&mut quiet, limit, "rank 1");
    let out = read(dir.path(), 0, "out");
    assert!(
        s0.success() && s1.success(),
        "{out}{}",
        read(dir.path(), 1, "err")
    );
    let s = out.lines().find(|l| l.starts_with("summary: ")).unwrap();
    assert_eq!(value(s, "job.ranks="), Some("1/2"), "{s}");
    assert_eq!(value(s, "job.missing="), Some("r1"), "{s}");
    assert_eq!(value(s, "job.tokens="), value(s, "tokens="), "{s}");
    assert_eq!(
        value(s, "job.slowest="),
        None,
        "one rank is no ranking: {s}"
    );
}
