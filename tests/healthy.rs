//! Issue 44: a healthy run, with default settings, raises no warning of severity warn or error
//! and writes no flight dump: the tiny preset, chat data through a tiny target's own chat
//! template (the specforge recipe a `--target` directory gets: a drafter step takes half a
//! minute on a CPU), and the Python example pipeline watched by `attach --flight`, a minute each.
//!
//! The three run side by side, a minute in all rather than three: they do slow one another (on
//! the 2-core host this was written on, with other builds running, the tiny preset made 1,816 and
//! 1,918 tok/s beside the others, 2,994 alone), but no rule is judged on speed; they judge shares
//! of time spent waiting, and a loaded host, whose scheduler makes those shares jitter, is where
//! a wrong threshold shows (this test found `queue_jitter` at start-up and after one such hiccup).

use crate::support::{bin, repo, served_socket, wait_within};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long each run is watched.
const RUN_S: u64 = 60;

/// `cmd` with its stdout and stderr into `dir/NAME.out` and `dir/NAME.err`, serving under the
/// runtime directory `runtime`.
fn spawn(mut cmd: Command, dir: &Path, name: &str, runtime: &Path) -> Child {
    let file = |ext: &str| std::fs::File::create(dir.join(format!("{name}.{ext}"))).unwrap();
    cmd.env("XDG_RUNTIME_DIR", runtime)
        .stdin(Stdio::null())
        .stdout(file("out"))
        .stderr(file("err"))
        .spawn()
        .unwrap_or_else(|e| panic!("{name} starts: {e}"))
}

fn read(dir: &Path, name: &str, ext: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.{ext}"))).unwrap_or_default()
}

/// Sends `sig` to a child of this test.
fn signal(child: &Child, sig: i32) {
    // SAFETY: kill with the pid of a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// A field's count in an interval line (`warn.warn=1`), 0 where absent.
fn count(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// What in a headless output breaks the promise: a `flight:` line, or an interval line with a
/// warning of severity warn or error in force. And the interval lines.
fn check(out: &str) -> (Vec<&str>, usize) {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
    let bad = out
        .lines()
        .filter(|l| {
            l.starts_with("flight: ")
                || (l.starts_with("t=") && count(l, "warn.warn=") + count(l, "warn.error=") > 0)
        })
        .collect();
    (bad, lines.len())
}

/// The files a flight directory holds (none when it was never made).
fn dumps_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|it| {
            it.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A tiny target directory with a word tokenizer and a chat template, and `n` conversations of
/// its words as chat JSONL: the target and the data file.
fn chat_target_and_data(dir: &Path, n: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    crate::runs::write_tiny_target(&target, |_| {});
    crate::engine::word_tokenizer(&target);
    let template = r#"{% for m in messages %}{{ '<|im_start|>' + m.role + ' ' + m.content.strip() + '<|im_end|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant' }}{% endif %}"#;
    std::fs::write(
        target.join("tokenizer_config.json"),
        serde_json::json!({ "chat_template": template }).to_string(),
    )
    .unwrap();
    let words = ["hi", "there", "how", "are", "you", "fine"];
    let mut lines = String::new();
    let mut x: u64 = 12345;
    let mut say = |len: usize| -> String {
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                words[(x >> 33) as usize % words.len()]
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    for k in 0..n {
        let turns: Vec<serde_json::Value> = (0..2 + k % 3)
            .flat_map(|t| {
                [
                    serde_json::json!({"role": "user", "content": say(3 + t % 4)}),
                    serde_json::json!({"role": "assistant", "content": say(5 + (k + t) % 9)}),
                ]
            })
            .collect();
        lines.push_str(&serde_json::json!({ "messages": turns }).to_string());
        lines.push('\n');
    }
    let data = dir.join("chat.jsonl");
    std::fs::write(&data, lines).unwrap();
    (target, data)
}

#[test]
fn a_minute_of_healthy_runs_raises_no_warning_and_writes_no_dump() {
    let dir = tempfile::tempdir().unwrap();
    let (d, runtime) = (dir.path(), dir.path().join("run"));
    std::fs::create_dir(&runtime).unwrap();
    let (target, data) = chat_target_and_data(d, 2000);
    let train = |extra: &[&str], save: &str| {
        let mut c = bin();
        c.args(["train", "--headless", "--interval", "1", "--save-dir", save])
            .args(extra)
            .current_dir(d);
        c
    };
    let started = Instant::now();
    let mut tiny = spawn(train(&[], "tiny"), d, "tiny", &runtime);
    let chat_args = [
        "--target",
        target.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
    ];
    let mut chat = spawn(train(&chat_args, "chat"), d, "chat", &runtime);
    let mut python = Command::new(repo().join(".venv/bin/python"));
    python
        .arg(repo().join("python/examples/pipeline.py"))
        .args(["--seconds", &(RUN_S + 30).to_string()])
        .env("PYTHONPATH", repo().join("python"));
    let mut python = spawn(python, d, "python", &runtime);
    served_socket("the Python pipeline's socket", &runtime, python.id());
    let mut attach = bin();
    attach
        .args(["attach", &python.id().to_string(), "--headless"])
        .args(["--seconds", &RUN_S.to_string(), "--interval", "1"])
        .args(["--flight", d.join("python-flight").to_str().unwrap()]);
    let mut attach = spawn(attach, d, "attach", &runtime);

    let left = Duration::from_secs(RUN_S).saturating_sub(started.elapsed());
    std::thread::sleep(left);
    for run in [&tiny, &chat] {
        signal(run, libc::SIGINT);
    }
    let limit = Duration::from_secs(120);
    let ended = [
        ("tiny", wait_within(&mut tiny, limit, "the tiny run")),
        ("chat", wait_within(&mut chat, limit, "the chat run")),
        ("attach", wait_within(&mut attach, limit, "attach")),
    ];
    signal(&python, libc::SIGTERM);
    wait_within(&mut python, limit, "the Python pipeline");

    for (name, status) in ended {
        let (out, err) = (read(d, name, "out"), read(d, name, "err"));
        // The training runs stopped by a signal (130), as a user's Ctrl-C; attach by its time.
        let want = if name == "attach" { 0 } else { 130 };
        assert_eq!(status.code(), Some(want), "{name}: {out}{err}");
        let (bad, lines) = check(&out);
        // What each run came to, in the test's output (`--nocapture`).
        let last = out
            .lines()
            .rfind(|l| l.starts_with("summary: ") || l.starts_with("t="));
        eprintln!("{name}: {lines} interval lines; {}", last.unwrap_or("-"));
        assert!(
            lines as u64 >= RUN_S / 2,
            "{name} watched for a minute: {lines} interval lines\n{out}{err}"
        );
        assert!(
            bad.is_empty(),
            "{name}: a healthy run warned or dumped:\n{}",
            bad.join("\n")
        );
        if name != "attach" {
            let steps = out
                .lines()
                .find_map(|l| l.strip_prefix("summary: step="))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok());
            assert!(steps.is_some_and(|s| s > 0), "{name} trained: {out}{err}");
        }
    }
    for flight in ["tiny/flight", "chat/flight", "python-flight"] {
        assert_eq!(dumps_in(&d.join(flight)), Vec::<String>::new(), "{flight}");
    }
}
