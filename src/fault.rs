//! Test-only fault injection, from the environment variable `DFLASH_TOP_FAULT`: a comma-separated
//! list of faults, read once. The tests in tests/reliability.rs use it to reach paths that real
//! faults reach only on a bad day. Nothing sets it in normal use; unset, every check is a load of
//! an initialised `OnceLock` and a scan of an empty list.
//!
//! - `save_write`: writing a checkpoint fails after its first file (like a full disk).
//! - `save_slow`: each checkpoint save waits 10 s first, its temporary directory made (holds a
//!   graceful stop open in the middle of a save).
//! - `no_nvml`: NVML is loaded from a path where it is not, as on a machine without the NVIDIA
//!   driver.
//! - `nan:STEPS`: the drafter's loss is NaN at these of its iterations (steps attempted, skipped
//!   ones included; 1-based), e.g. `nan:3-5+9`
//!   (`+` separates items, `a-b` is a range, `a-` is every step from a on).
//! - `panic:ROLE`, `error:ROLE`, `oom:ROLE`: the first worker of that role (`loader`, `target`,
//!   `drafter`) panics, returns an error, or returns libtorch's CUDA out-of-memory message, at
//!   its third iteration.
//! - `panic_at_start:THREAD`: the worker thread of that name (`drafter-0`) panics as it starts
//!   (the tests of the terminal's restore path).
//! - `hold_start:FILE`: `train`'s TUI waits before starting its run until FILE exists (keys typed
//!   while a run starts, at a pace the test sets).

use std::sync::OnceLock;

fn faults() -> &'static [String] {
    static FAULTS: OnceLock<Vec<String>> = OnceLock::new();
    FAULTS.get_or_init(|| {
        std::env::var("DFLASH_TOP_FAULT")
            .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
            .unwrap_or_default()
    })
}

/// Whether the fault `name` (with no argument) is set.
pub fn is(name: &str) -> bool {
    faults().iter().any(|f| f == name)
}

/// The argument of `name:ARG`, if set.
pub fn arg(name: &str) -> Option<&'static str> {
    faults()
        .iter()
        .find_map(|f| f.strip_prefix(name)?.strip_prefix(':'))
}

/// Whether `panic_at_start:THREAD` names `thread`.
pub fn panic_at_start(thread: &str) -> bool {
    arg("panic_at_start") == Some(thread)
}

/// Whether `nan:STEPS` covers the drafter's iteration `step` (1-based).
pub fn nan_at(step: u64) -> bool {
    let Some(spec) = arg("nan") else { return false };
    spec.split('+').any(|item| match item.split_once('-') {
        Some((a, "")) => a.parse().is_ok_and(|a: u64| step >= a),
        Some((a, b)) => {
            a.parse().is_ok_and(|a: u64| step >= a) && b.parse().is_ok_and(|b: u64| step <= b)
        }
        None => item.parse() == Ok(step),
    })
}

/// The worker fault for a thread (`drafter-0` matches role `drafter`) at `iteration` (0-based):
/// panics for `panic:ROLE`, an error for `error:ROLE` and `oom:ROLE`.
pub fn worker(thread: &str, iteration: u64) -> anyhow::Result<()> {
    if iteration != 2 || faults().is_empty() {
        return Ok(());
    }
    let first_of = |role: &str| thread == role || thread == format!("{role}-0");
    if arg("panic").is_some_and(first_of) {
        panic!("injected panic in {thread} (DFLASH_TOP_FAULT)");
    }
    if arg("error").is_some_and(first_of) {
        anyhow::bail!("injected error (DFLASH_TOP_FAULT)");
    }
    if arg("oom").is_some_and(first_of) {
        anyhow::bail!(
            "CUDA out of memory. Tried to allocate 2.00 GiB (injected by DFLASH_TOP_FAULT)"
        );
    }
    Ok(())
}
