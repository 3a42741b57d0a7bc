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
//! - `oom_at_build:ROLE`: building that role's model (`target`, `drafter`) panics as tch does on
//!   libtorch's CUDA out-of-memory, the C++ frames in its message.
//! - `panic_at_start:THREAD`: the worker thread of that name (`drafter-0`) panics as it starts
//!   (the tests of the terminal's restore path).
//! - `item_in_loss`: each drafter step reads its loss back to the host 4 times in its `loss`
//!   phase (as code that logs `.item()` there does): the seeded case of the `host_sync` warning.
//! - `vary_shapes`: the loader packs each batch to a different row length (between half and all
//!   of `seq_len`, in steps of 64 tokens, finer where `seq_len` is under 1024): the seeded case
//!   of the `shapes_vary` warning. With room on the device libtorch's cache soon holds blocks
//!   for every length; a short `alloc_churn` window can catch it growing in the first seconds
//!   (docs/usage.md).
//! - `empty_cache`: each drafter step on a GPU empties libtorch's cache after its loss (as a
//!   loop calling `torch.cuda.empty_cache()` does): the seeded case of the `alloc_churn`
//!   warning, the allocator going back to the device every step.
//! - `host:NAME`: a session says it runs on host NAME (its hello's host), so that a viewer on
//!   this host takes it as one joined through a socket forwarded from another host (its GPUs
//!   from its samples, not this host's NVML).
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

/// `oom_at_build:ROLE`: panics as tch's `unwrap` of libtorch's out-of-memory does.
pub fn oom_at_build(role: &str) {
    if arg("oom_at_build") == Some(role) {
        panic!(
            "called `Result::unwrap()` on an `Err` value: Torch(\"CUDA out of memory. Tried to \
             allocate 9.57 GiB (injected by DFLASH_TOP_FAULT)\\nException raised from malloc at \
             CUDACachingAllocator.cpp:1574 (most recent call first):\\nframe #0: \
             c10::Error::Error\")"
        );
    }
}

/// Reads of the loss back to the host that `item_in_loss` adds to each drafter step.
pub fn item_reads_in_loss() -> usize {
    if is("item_in_loss") {
        4
    } else {
        0
    }
}

/// The row length of the loader's batch `iteration` (0-based): `seq`, or under `vary_shapes` a
/// length that differs from the last one, at least half of `seq`, in steps of 64 tokens (of
/// `seq / 16`, at least 8, where `seq` is under 1024).
pub fn seq_len(seq: i64, iteration: u64) -> i64 {
    if !is("vary_shapes") {
        return seq;
    }
    varied_seq_len(seq, iteration)
}

fn varied_seq_len(seq: i64, iteration: u64) -> i64 {
    let grain = (seq / 16).clamp(8, 64);
    let floor = (seq / 2).max(grain.min(seq));
    let choices = ((seq - floor) / grain + 1) as u64;
    if choices < 2 {
        return seq;
    }
    // Scattered over the range (a step's neighbours differ), never the previous length.
    let pick = |i: u64| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % choices;
    let mut k = pick(iteration);
    if iteration > 0 && k == pick(iteration - 1) {
        k = (k + 1) % choices;
    }
    seq - grain * k as i64
}

/// The host name `host:NAME` makes a session give.
pub fn host_name() -> Option<String> {
    arg("host").map(String::from)
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

#[cfg(test)]
mod tests {
    use super::varied_seq_len;

    #[test]
    fn varied_lengths_change_every_batch_and_stay_between_half_and_all_of_seq() {
        let lengths: Vec<i64> = (0..200).map(|i| varied_seq_len(3072, i)).collect();
        assert!(lengths
            .iter()
            .all(|&n| (1536..=3072).contains(&n) && n % 64 == 0));
        assert!(lengths.windows(2).all(|w| w[0] != w[1]));
        let mut distinct = lengths.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 10, "{distinct:?}");
        // A short row (the CPU's default 256) varies in finer steps, as often.
        let mut short: Vec<i64> = (0..50).map(|i| varied_seq_len(256, i)).collect();
        assert!(short.windows(2).all(|w| w[0] != w[1]));
        assert!(short
            .iter()
            .all(|&n| (128..=256).contains(&n) && n % 16 == 0));
        short.sort();
        short.dedup();
        assert!(short.len() >= 8, "{short:?}");
        assert_eq!(varied_seq_len(8, 3), 8, "too short to vary");
    }
}
