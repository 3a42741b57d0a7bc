//! Live time: the step a thread is in, counted up to now and cut to a window, so that a phase or
//! a wait that has not ended shows while it lasts (the step's record replaces it once it ends).

use super::phase::Phase;
use super::phase_recorder::LiveRead;
use super::window::InFlight;

/// A thread's step in progress, and what is needed to count it up to now.
pub struct LiveTime {
    pub live: LiveRead,
    /// The thread's typical step time, when it has ended steps.
    pub expected_ns: Option<u64>,
    /// Tokens its steps bring (drafters: the tok/s count).
    pub tokens: u64,
    /// Profiling is on (the live phase is current).
    pub phases: bool,
    /// The thread's phases are device-timed (`events`): live host time shows only for a wait or
    /// a phase running past the stall threshold; the device record covers the rest.
    pub device_timed: bool,
    /// Its live phase is a wait on a queue (by its pipeline's names).
    pub waiting: bool,
    pub stall_ns: u64,
}

impl LiveTime {
    /// The step in progress cut to the window from `from` to `now`.
    pub fn in_window(&self, now: u64, from: u64) -> InFlight {
        let l = &self.live;
        let phase_start = l.phase_start_ns.min(now);
        let step_start = l.step_start_ns.min(phase_start);
        let elapsed = now - step_start;
        let mut out = InFlight::default();
        if let Some(expected) = self.expected_ns.filter(|e| *e > 0) {
            // Tokens arrive at the typical rate until the step's worth is in.
            let credited = overlap_ns((step_start, step_start + expected), (from, now));
            out.tokens = self.tokens as f64 * credited as f64 / expected as f64;
        }
        if !self.phases {
            return out;
        }
        let current = now.saturating_sub(phase_start.max(from));
        if self.device_timed {
            let stuck = now - phase_start;
            if self.waiting || stuck > self.stall_ns {
                out.phase_ns[l.phase.index()] = current;
                out.step_share =
                    current as f64 / self.expected_ns.unwrap_or(stuck).max(stuck).max(1) as f64;
            }
            return out;
        }
        let earlier_in = phase_start.saturating_sub(step_start.max(from));
        let earlier_total: u64 = l.acc_ns.iter().sum();
        if earlier_total > 0 {
            for (out, acc) in out.phase_ns.iter_mut().zip(l.acc_ns) {
                *out = (acc as f64 * earlier_in as f64 / earlier_total as f64) as u64;
            }
        } else {
            out.phase_ns[Phase::Other.index()] = earlier_in;
        }
        out.phase_ns[l.phase.index()] += current;
        let in_window: u64 = out.phase_ns.iter().sum();
        let whole = self.expected_ns.unwrap_or(elapsed).max(elapsed).max(1);
        out.step_share = in_window as f64 / whole as f64;
        out
    }
}

fn overlap_ns(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}
