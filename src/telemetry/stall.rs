//! Stall detection: each thread's recent host steps, how long the pipeline may go without a step
//! ending before it counts as stalled, and which thread to name when it does. The recent steps
//! also give live time its typical step time and token count, and the `shapes_vary` warning the
//! sizes of the last steps.

use super::names::Names;
use super::phase_recorder::{LiveRead, StepRecord, ThreadInfo};
use super::snapshot::StepSizes;
use super::window::push_capped;
use std::collections::VecDeque;

/// Host step times kept per thread for the typical step time.
const RECENT_STEPS: usize = 16;
/// Step sizes (tokens) kept per thread for `StepSizes`: enough steps that a run padding to a
/// few bucket lengths shows fewer sizes than `shapes_distinct`'s default.
pub const SIZE_STEPS: usize = 16;
/// No step ended for this many pipeline step times: the pipeline is stalled…
pub const STALL_STEPS: f64 = 5.0;
/// …and for at least this long…
pub const STALL_MIN_NS: u64 = 1_000_000_000;
/// …or this long while some thread has not ended a step yet.
pub const STALL_WARMUP_NS: u64 = 10_000_000_000;
/// A thread working (not waiting) in its first step is starting up (lazy allocation, autograd's
/// first graph, a compile): the pipeline is not stalled until that step has lasted this long,
/// from the thread's own step start, however long ago the other threads ended theirs.
pub const FIRST_STEP_NS: u64 = 30_000_000_000;

/// A thread's recent host steps.
#[derive(Clone, Debug, Default)]
struct ThreadSteps {
    walls: VecDeque<u64>,
    tokens: u64,
    /// The tokens of the last steps that brought any, oldest first.
    sizes: VecDeque<u64>,
    last_end_ns: Option<u64>,
}

impl ThreadSteps {
    fn push(&mut self, r: &StepRecord) {
        push_capped(&mut self.walls, r.wall_ns, RECENT_STEPS);
        self.tokens = r.tokens;
        if r.tokens > 0 {
            push_capped(&mut self.sizes, r.tokens, SIZE_STEPS);
        }
        self.last_end_ns = Some(self.last_end_ns.unwrap_or(0).max(r.end_ns));
    }

    fn median_wall(&self) -> Option<u64> {
        let mut v: Vec<u64> = self.walls.iter().copied().collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied()
    }
}

/// Recent host steps of every thread, by record index.
#[derive(Clone, Debug, Default)]
pub struct RecentSteps {
    threads: Vec<ThreadSteps>,
}

impl RecentSteps {
    /// Takes a record; only host records (ones that end iterations) count.
    pub fn push(&mut self, r: &StepRecord) {
        if r.steps == 0 {
            return;
        }
        if self.threads.len() <= r.thread {
            self.threads.resize_with(r.thread + 1, ThreadSteps::default);
        }
        self.threads[r.thread].push(r);
    }

    /// Thread `i`'s typical (median) step time, once it has ended steps.
    pub fn expected_ns(&self, i: usize) -> Option<u64> {
        self.threads.get(i).and_then(|r| r.median_wall())
    }

    /// Tokens thread `i`'s last step brought.
    pub fn tokens(&self, i: usize) -> u64 {
        self.threads.get(i).map(|r| r.tokens).unwrap_or(0)
    }

    /// The sizes of thread `i`'s last steps (up to `SIZE_STEPS`), once one brought tokens.
    pub fn sizes(&self, i: usize) -> Option<StepSizes> {
        let sizes = &self.threads.get(i)?.sizes;
        let mut distinct: Vec<u64> = sizes.iter().copied().collect();
        distinct.sort_unstable();
        distinct.dedup();
        Some(StepSizes {
            steps: sizes.len() as u32,
            distinct: distinct.len() as u32,
            min: *distinct.first()?,
            max: *distinct.last()?,
        })
    }

    /// Some thread has ended a step.
    pub fn started(&self) -> bool {
        self.threads.iter().any(|r| r.last_end_ns.is_some())
    }

    /// No step may end for this long before the pipeline counts as stalled: several times the
    /// pipeline's step time (the slowest thread's median step), at least `STALL_MIN_NS`; and
    /// while some of the `threads` has not ended its first step yet (start-up: CUDA and model
    /// warm-up), at least `STALL_WARMUP_NS`. Never, before any step has ended.
    pub fn threshold_ns(&self, threads: usize) -> u64 {
        let slowest = self.threads.iter().filter_map(|r| r.median_wall()).max();
        let started = self
            .threads
            .iter()
            .filter(|r| r.last_end_ns.is_some())
            .count();
        let floor = if started < threads {
            STALL_WARMUP_NS
        } else {
            STALL_MIN_NS
        };
        slowest
            .map(|t| ((t as f64 * STALL_STEPS) as u64).max(floor))
            .unwrap_or(u64::MAX)
    }

    /// "target-0 in forward for 12.0 s" once no step has ended for `threshold_ns` and no thread
    /// is working in a first step younger than `FIRST_STEP_NS`: the thread that has been in one
    /// working phase longest (a waiting one only if none works), in the words of `names`.
    pub fn stall(
        &self,
        now_ns: u64,
        threads: &[ThreadInfo],
        live: &[LiveRead],
        threshold_ns: u64,
        names: &Names,
    ) -> Option<String> {
        let last_end = self.threads.iter().filter_map(|r| r.last_end_ns).max()?;
        if now_ns.saturating_sub(last_end) <= threshold_ns {
            return None;
        }
        let starting_up = live.iter().enumerate().any(|(i, l)| {
            let first_step = self.threads.get(i).is_none_or(|r| r.last_end_ns.is_none());
            first_step
                && !names.is_wait(l.phase)
                && now_ns.saturating_sub(l.step_start_ns) <= FIRST_STEP_NS
        });
        if starting_up {
            return None;
        }
        let (t, l) = threads.iter().zip(live).max_by_key(|(_, l)| {
            let stuck = now_ns.saturating_sub(l.phase_start_ns);
            (!names.is_wait(l.phase), stuck)
        })?;
        let secs = now_ns.saturating_sub(l.phase_start_ns) as f64 / 1e9;
        Some(format!(
            "{} in {} for {secs:.1} s",
            t.name,
            names.phase(l.phase)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::{Phase, Role};
    use std::sync::Arc;

    const MS: u64 = 1_000_000;

    fn step(thread: usize, end_ms: u64, wall_ms: u64) -> StepRecord {
        StepRecord {
            thread,
            end_ns: end_ms * MS,
            wall_ns: wall_ms * MS,
            steps: 1,
            ..StepRecord::default()
        }
    }

    fn worker(name: &str, role: Role) -> ThreadInfo {
        ThreadInfo {
            name: name.into(),
            role,
            device: "cpu".into(),
            tid: 0,
            live: Arc::default(),
        }
    }

    fn in_phase(phase: Phase, since_ms: u64) -> LiveRead {
        LiveRead {
            phase,
            phase_start_ns: since_ms * MS,
            step_start_ns: since_ms * MS,
            ..LiveRead::default()
        }
    }

    /// Two threads whose steps last `target_ms` and `drafter_ms`, the last ending at 10 s.
    fn steady(target_ms: u64, drafter_ms: u64) -> RecentSteps {
        let mut r = RecentSteps::default();
        for k in 0..RECENT_STEPS as u64 {
            r.push(&step(0, 10_000 - k * target_ms, target_ms));
            r.push(&step(1, 10_000 - k * drafter_ms, drafter_ms));
        }
        r
    }

    #[test]
    fn the_threshold_is_several_of_the_slowest_steps_with_a_floor() {
        // The slowest thread sets the pipeline's step: 5 x 400 ms.
        assert_eq!(steady(400, 100).threshold_ns(2), 2_000 * MS);
        // Fast steps: the one-second floor.
        assert_eq!(steady(10, 20).threshold_ns(2), STALL_MIN_NS);
        // The typical step is the median: one slow outlier does not move it.
        let mut r = steady(400, 100);
        r.push(&step(0, 20_000, 9_000));
        assert_eq!(r.threshold_ns(2), 2_000 * MS);
    }

    #[test]
    fn step_sizes_are_the_last_steps_that_brought_tokens() {
        let mut r = RecentSteps::default();
        assert_eq!(r.sizes(0), None);
        let sized = |end_ms, tokens| StepRecord {
            tokens,
            ..step(0, end_ms, 10)
        };
        r.push(&sized(10, 0));
        // A step without tokens (one that trains nothing) gives no size.
        assert_eq!(r.sizes(0), None);
        for (k, tokens) in [2048, 3072, 2048, 1536].into_iter().enumerate() {
            r.push(&sized(20 + k as u64, tokens));
        }
        let z = r.sizes(0).unwrap();
        assert_eq!((z.steps, z.distinct, z.min, z.max), (4, 3, 1536, 3072));
        // Only the last SIZE_STEPS count: steady sizes push the varied ones out.
        for k in 0..SIZE_STEPS as u64 {
            r.push(&sized(100 + k, 4096));
        }
        let z = r.sizes(0).unwrap();
        let last = SIZE_STEPS as u32;
        assert_eq!((z.steps, z.distinct, z.min, z.max), (last, 1, 4096, 4096));
    }

    #[test]
    fn start_up_waits_longer_and_nothing_stalls_before_a_first_step() {
        assert_eq!(RecentSteps::default().threshold_ns(2), u64::MAX);
        let mut r = RecentSteps::default();
        r.push(&step(0, 1_000, 10));
        // Thread 1 has not ended a step yet: CUDA and model warm-up.
        assert_eq!(r.threshold_ns(2), STALL_WARMUP_NS);
        r.push(&step(1, 1_010, 10));
        assert_eq!(r.threshold_ns(2), STALL_MIN_NS);
        // Device records (no step ended) neither start a thread nor set its step time.
        let mut r = RecentSteps::default();
        r.push(&step(0, 1_000, 10));
        r.push(&StepRecord {
            steps: 0,
            ..step(1, 1_000, 5_000)
        });
        assert_eq!(r.threshold_ns(2), STALL_WARMUP_NS);
        assert_eq!(r.expected_ns(1), None);
    }

    #[test]
    fn stalled_only_past_the_threshold_naming_the_longest_working_phase() {
        let r = steady(100, 100);
        let names = Names::builtin();
        let threshold = r.threshold_ns(2);
        assert_eq!(threshold, STALL_MIN_NS);
        let threads = [
            worker("target-0", Role::Target),
            worker("drafter-0", Role::Drafter),
        ];
        // The drafter has waited longer, but the target is the one working: it is named.
        let live = [
            in_phase(Phase::Forward, 9_500),
            in_phase(Phase::HsWait, 9_000),
        ];
        let last_end = 10_000 * MS;
        assert_eq!(
            r.stall(last_end + threshold, &threads, &live, threshold, &names),
            None
        );
        assert_eq!(
            r.stall(
                last_end + threshold + MS,
                &threads,
                &live,
                threshold,
                &names
            )
            .as_deref(),
            Some("target-0 in forward for 1.5 s")
        );
        // All waiting: the longest wait is named.
        let waiting = [
            in_phase(Phase::BatchWait, 9_500),
            in_phase(Phase::HsWait, 9_000),
        ];
        assert_eq!(
            r.stall(12_000 * MS, &threads, &waiting, threshold, &names)
                .as_deref(),
            Some("drafter-0 in hs_wait for 3.0 s")
        );
    }

    #[test]
    fn a_thread_working_in_its_first_step_is_starting_up_not_stalled() {
        // The target ended steps and waits on a full queue; the drafter works in its first step.
        let mut r = RecentSteps::default();
        r.push(&step(0, 1_000, 10));
        let names = Names::builtin();
        let threads = [
            worker("target-0", Role::Target),
            worker("drafter-0", Role::Drafter),
        ];
        let threshold = r.threshold_ns(2);
        assert_eq!(threshold, STALL_WARMUP_NS);
        let live = [
            in_phase(Phase::HsPushWait, 1_000),
            in_phase(Phase::Backward, 2_000),
        ];
        let start = 2_000 * MS;
        // Past the start-up floor since the target's last step, within the first step's own.
        let now = 1_000 * MS + threshold + 5_000 * MS;
        assert_eq!(r.stall(now, &threads, &live, threshold, &names), None);
        // The first step goes on past its allowance: stalled, the working drafter named.
        let now = start + FIRST_STEP_NS + MS;
        assert_eq!(
            r.stall(now, &threads, &live, threshold, &names).as_deref(),
            Some("drafter-0 in backward for 30.0 s")
        );
        // A thread that waits in its first step buys no time: the target is the one stuck.
        let waiting = [in_phase(Phase::Forward, 1_000), in_phase(Phase::HsWait, 0)];
        let now = 1_000 * MS + threshold + MS;
        assert_eq!(
            r.stall(now, &threads, &waiting, threshold, &names)
                .as_deref(),
            Some("target-0 in forward for 10.0 s")
        );
    }
}
