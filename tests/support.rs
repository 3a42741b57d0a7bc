//! Helpers the integration test modules share: the binary under test and its output, the
//! repository root, a headless line's fields, and waiting for a condition on a loaded machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The dflash-top binary this test build made; on a GPU host, which has the test binaries but
/// not the build tree (tests/tools/gpu_tests.sh), the release binary in `.gpu/` of the
/// directory the tests run in.
pub fn bin() -> Command {
    let built = std::path::Path::new(env!("CARGO_BIN_EXE_dflash-top"));
    if built.exists() {
        Command::new(built)
    } else {
        Command::new(".gpu/dflash-top")
    }
}

/// The binary run to its end with `args`.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("binary runs")
}

/// `dflash-top train --headless` with `args`, run to its end.
pub fn train(args: &[&str]) -> Output {
    bin()
        .args(["train", "--headless"])
        .args(args)
        .output()
        .expect("binary runs")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The number of `key=` in a headless line (`step=12 loss=3.4 …`), where there is one.
pub fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Waits up to a minute (a loaded machine) for `ok`, with `what` in the failure.
pub fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The socket process `pid` serves under the runtime directory `runtime` (its
/// XDG_RUNTIME_DIR).
pub fn socket_of(runtime: &Path, pid: u32) -> PathBuf {
    runtime.join("dflash-top").join(format!("{pid}.sock"))
}

/// `socket_of`, once it exists (waiting as `wait_until` does, `what` in the failure).
pub fn served_socket(what: &str, runtime: &Path, pid: u32) -> PathBuf {
    let sock = socket_of(runtime, pid);
    wait_until(what, || sock.exists());
    sock
}

/// `attach PID --headless` for `seconds`, a line a second, under the runtime directory
/// `runtime`: its output.
pub fn attach_headless(runtime: &Path, pid: u32, seconds: u32) -> std::process::Output {
    bin()
        .args(["attach", &pid.to_string(), "--headless"])
        .args(["--seconds", &seconds.to_string(), "--interval", "1"])
        .env("XDG_RUNTIME_DIR", runtime)
        .output()
        .unwrap()
}

/// `train --headless` that runs until it is stopped, an interval line every `interval_s`
/// seconds, serving under the runtime directory `runtime`.
pub fn endless_train(runtime: &Path, interval_s: u32) -> Command {
    let mut c = bin();
    c.args(["train", "--headless", "--steps", "100000", "--interval"])
        .arg(interval_s.to_string())
        .env("XDG_RUNTIME_DIR", runtime);
    c
}

/// A TCP port of this host that was free a moment ago (bound, then let go): a job's
/// MASTER_PORT.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to `limit` for `child`; kills it and fails past that (no test hangs on a child).
pub fn wait_within(
    child: &mut std::process::Child,
    limit: Duration,
    what: &str,
) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
