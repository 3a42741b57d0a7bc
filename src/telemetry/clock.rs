//! The profiler's clock: the CPU's invariant time-stamp counter where both the CPU flags say it is
//! invariant (`constant_tsc` + `nonstop_tsc`) and the kernel itself keeps time with it (its
//! clocksource is `tsc`: a kernel that distrusts the TSC has switched away from it), otherwise the
//! monotonic clock. A mark reads ticks; ticks become nanoseconds only when a step record is built,
//! off the per-mark path. Differences are taken with `elapsed`, which never wraps: a TSC read on
//! another core that is a little behind gives zero, not 584 years.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Calibration {
    use_tsc: bool,
    base: Instant,
    base_ticks: u64,
    ns_per_tick: f64,
}

static CALIBRATION: OnceLock<Calibration> = OnceLock::new();

const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// Whether the TSC may be used: the CPU flags in `cpuinfo` and the kernel's `clocksource` agree.
pub fn tsc_usable(cpuinfo: &str, clocksource: &str) -> bool {
    let flags = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .unwrap_or("");
    let has = |name: &str| flags.split_whitespace().any(|f| f == name);
    has("constant_tsc") && has("nonstop_tsc") && clocksource.trim() == "tsc"
}

fn tsc_is_invariant() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let source = std::fs::read_to_string(CLOCKSOURCE).unwrap_or_default();
    tsc_usable(&info, &source)
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

/// Ticks from `earlier` to `later`; zero if the clock appears to have stepped back.
#[inline(always)]
pub fn elapsed(earlier: u64, later: u64) -> u64 {
    later.saturating_sub(earlier)
}

/// Converts a tick difference to nanoseconds.
#[inline]
pub fn ticks_to_ns(ticks: u64) -> u64 {
    (ticks as f64 * calibration().ns_per_tick) as u64
}

/// Converts nanoseconds to a tick difference (the inverse of `ticks_to_ns`).
pub fn ns_to_ticks(ns: u64) -> u64 {
    (ns as f64 / calibration().ns_per_tick) as u64
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

/// The tick reading at `ns` since the clock's base (the inverse of `ticks_to_epoch_ns`).
pub fn epoch_ns_to_ticks(ns: u64) -> u64 {
    let c = calibration();
    if c.use_tsc {
        c.base_ticks + (ns as f64 / c.ns_per_tick) as u64
    } else {
        ns
    }
}

/// Nanoseconds since the clock's base, now.
pub fn now_ns() -> u64 {
    ticks_to_epoch_ns(ticks())
}

/// This clock's reading minus CLOCK_MONOTONIC's, ns: what turns a timestamp into the one
/// every process on the host shares (the wire protocol's time), and back.
fn monotonic_offset() -> i128 {
    static OFFSET: OnceLock<i128> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let ours = now_ns();
        // SAFETY: clock_gettime writes the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let mono = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
        ours as i128 - mono
    })
}

/// A timestamp of this clock as CLOCK_MONOTONIC ns (what `time.monotonic_ns()` reads in Python).
pub fn to_monotonic(ns: u64) -> u64 {
    (ns as i128 - monotonic_offset()).max(0) as u64
}

/// A CLOCK_MONOTONIC timestamp on this clock (0 for one before the clock's base).
pub fn from_monotonic(mono: u64) -> u64 {
    (mono as i128 + monotonic_offset()).max(0) as u64
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
    fn tsc_needs_both_the_flags_and_the_kernel_clocksource() {
        let flags = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc rdtscp\n";
        assert!(tsc_usable(flags, "tsc\n"));
        assert!(
            !tsc_usable(flags, "hpet\n"),
            "kernel switched away from the TSC"
        );
        assert!(!tsc_usable(flags, ""), "clocksource unreadable");
        assert!(!tsc_usable("flags : fpu tsc constant_tsc\n", "tsc"));
    }

    #[test]
    fn monotonic_timestamps_round_trip() {
        let now = now_ns() + 1_000;
        assert!(from_monotonic(to_monotonic(now)).abs_diff(now) <= 1);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec we own.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let mono = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        assert!(to_monotonic(now_ns()).abs_diff(mono) < 5_000_000);
    }

    #[test]
    fn a_backward_step_is_zero_not_a_huge_duration() {
        assert_eq!(elapsed(1_000, 990), 0);
        assert_eq!(elapsed(990, 1_000), 10);
    }

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
