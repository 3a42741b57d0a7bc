//! The profiler's clock: the CPU's invariant time-stamp counter where the kernel says it is
//! reliable (`constant_tsc` + `nonstop_tsc`), otherwise the monotonic clock. A mark reads ticks;
//! ticks become nanoseconds only when a step record is built, off the per-mark path.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Calibration {
    use_tsc: bool,
    base: Instant,
    base_ticks: u64,
    ns_per_tick: f64,
}

static CALIBRATION: OnceLock<Calibration> = OnceLock::new();

fn tsc_is_invariant() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
    flags.split_whitespace().any(|f| f == "constant_tsc")
        && flags.split_whitespace().any(|f| f == "nonstop_tsc")
}

#[inline(always)]
fn read_tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}

fn calibration() -> &'static Calibration {
    CALIBRATION.get_or_init(|| {
        let base = Instant::now();
        if !tsc_is_invariant() {
            return Calibration {
                use_tsc: false,
                base,
                base_ticks: 0,
                ns_per_tick: 1.0,
            };
        }
        let t0 = read_tsc();
        let i0 = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let t1 = read_tsc();
        let elapsed = i0.elapsed().as_nanos() as f64;
        let ns_per_tick = elapsed / (t1.wrapping_sub(t0)).max(1) as f64;
        Calibration {
            use_tsc: true,
            base: i0,
            base_ticks: t0,
            ns_per_tick,
        }
    })
}

/// Calibrate now (20 ms on first call) so that no worker pays for it mid-run.
pub fn init() {
    calibration();
}

/// Current time in ticks. Monotonic within a process.
#[inline(always)]
pub fn ticks() -> u64 {
    let c = calibration();
    if c.use_tsc {
        read_tsc()
    } else {
        c.base.elapsed().as_nanos() as u64
    }
}

/// Converts a tick difference to nanoseconds.
#[inline]
pub fn ticks_to_ns(ticks: u64) -> u64 {
    (ticks as f64 * calibration().ns_per_tick) as u64
}

/// Nanoseconds since the clock's base for a tick reading (for timestamps in traces).
pub fn ticks_to_epoch_ns(t: u64) -> u64 {
    let c = calibration();
    if c.use_tsc {
        ticks_to_ns(t.saturating_sub(c.base_ticks))
    } else {
        t
    }
}

/// Nanoseconds since the clock's base, now.
pub fn now_ns() -> u64 {
    ticks_to_epoch_ns(ticks())
}

/// Which source the clock uses, for `doctor` and the self-cost line.
pub fn source() -> &'static str {
    if calibration().use_tsc {
        "tsc"
    } else {
        "monotonic"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_track_the_monotonic_clock() {
        let t0 = ticks();
        let i0 = Instant::now();
        std::thread::sleep(Duration::from_millis(30));
        let ns = ticks_to_ns(ticks() - t0) as f64;
        let real = i0.elapsed().as_nanos() as f64;
        assert!(
            (ns - real).abs() / real < 0.1,
            "tick clock {ns} ns vs monotonic {real} ns"
        );
    }
}
