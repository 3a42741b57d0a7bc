//! Helpers the integration test modules share: the binary under test, the repository root, and
//! waiting for a condition on a loaded machine.

use std::path::PathBuf;
use std::process::Command;
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

/// A TCP port of this host that was free a moment ago (bound, then let go): a job's
/// MASTER_PORT.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
