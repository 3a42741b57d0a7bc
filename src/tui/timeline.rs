//! The timeline's model, no terminal: from the step spans of the last seconds, one lane per
//! thread cut into columns, each column the phase that took most of its time; the queue depths
//! and the verdict changes on the same time axis.

use crate::telemetry::snapshot::{QueueView, StepSpan, ThreadState, ThreadView};
use crate::telemetry::window::TICK_NS;
use crate::telemetry::{Phase, N_PHASES};
use std::collections::HashMap;
use std::collections::VecDeque;

/// The span of time on screen: `[right_ns - width_ns, right_ns)` on the hub's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeSpan {
    pub right_ns: u64,
    pub width_ns: u64,
}

impl TimeSpan {
    pub fn left_ns(self) -> u64 {
        self.right_ns.saturating_sub(self.width_ns)
    }

    /// Whether a step span has any time inside.
    pub fn overlaps(self, s: &StepSpan) -> bool {
        s.end_ns > self.left_ns() && s.end_ns.saturating_sub(s.wall_ns) < self.right_ns
    }

    /// The column `t` falls in, for `cols` columns (None outside the span).
    pub fn column(self, t: u64, cols: usize) -> Option<usize> {
        let left = self.left_ns();
        if t < left || t >= self.right_ns || self.width_ns == 0 || cols == 0 {
            return None;
        }
        Some(Grid::new(self, cols).column(t))
    }

    fn col_start(self, col: usize, cols: usize) -> u64 {
        Grid::new(self, cols).start(col)
    }
}

/// Columns of a span on the hub's clock, in floating point (no division per segment).
#[derive(Clone, Copy)]
struct Grid {
    left: u64,
    right: u64,
    cols: usize,
    ns_per_col: f64,
}

impl Grid {
    fn new(span: TimeSpan, cols: usize) -> Grid {
        Grid {
            left: span.left_ns(),
            right: span.right_ns,
            cols,
            ns_per_col: span.width_ns as f64 / cols.max(1) as f64,
        }
    }

    fn start(&self, c: usize) -> u64 {
        if c >= self.cols {
            return self.right;
        }
        self.left + (c as f64 * self.ns_per_col) as u64
    }

    /// The column of `t`, which must lie in `[left, right)`.
    fn column(&self, t: u64) -> usize {
        let mut c = (((t - self.left) as f64 / self.ns_per_col) as usize).min(self.cols - 1);
        // Rounding can put `t` one column off the bounds `start` gives: follow `start`.
        while c > 0 && t < self.start(c) {
            c -= 1;
        }
        while c + 1 < self.cols && t >= self.start(c + 1) {
            c += 1;
        }
        c
    }

    /// Calls `f(column, ns)` for each column `[t0, t1)` covers, clipped to the span.
    fn each(&self, t0: u64, t1: u64, mut f: impl FnMut(usize, u64)) {
        let (mut t, t1) = (t0.max(self.left), t1.min(self.right));
        if t >= t1 || self.cols == 0 {
            return;
        }
        let mut c = self.column(t);
        while t < t1 {
            let end = self.start(c + 1).min(t1);
            f(c, end - t);
            t = end;
            c += 1;
        }
    }
}

/// One thread's row: per column, the phase that took most of it (None: nothing recorded).
#[derive(Clone, Debug, PartialEq)]
pub struct Lane {
    pub cells: Vec<Option<Phase>>,
}

/// Builds lanes column by column, one sweep over the spans in the order they ended.
struct LaneBuilder {
    cells: Vec<Option<Phase>>,
    col: Option<usize>,
    /// The current column's bounds: a segment inside them adds without any arithmetic.
    col_start: u64,
    col_end: u64,
    acc: [u64; N_PHASES],
}

impl LaneBuilder {
    fn new(cols: usize) -> LaneBuilder {
        LaneBuilder {
            cells: vec![None; cols],
            col: None,
            col_start: 0,
            col_end: 0,
            acc: [0; N_PHASES],
        }
    }

    fn flush(&mut self) {
        if let Some(c) = self.col.take() {
            let (best, ns) = self
                .acc
                .iter()
                .enumerate()
                .max_by_key(|(_, ns)| **ns)
                .unwrap_or((0, &0));
            if *ns > 0 {
                self.cells[c] = Phase::from_index(best);
            }
            self.acc = [0; N_PHASES];
        }
    }

    /// Adds `[t0, t1)` of `phase`, clipped to the grid.
    #[inline]
    fn add(&mut self, g: &Grid, t0: u64, t1: u64, phase: Phase) {
        // The common case: a segment within the column being filled (no arithmetic; the
        // bounds start empty, so the first segment takes the slow path).
        if t0 >= self.col_start && t1 <= self.col_end {
            self.acc[phase.index()] += t1 - t0;
        } else {
            self.add_across(g, t0, t1, phase);
        }
    }

    #[inline(never)]
    fn add_across(&mut self, g: &Grid, t0: u64, t1: u64, phase: Phase) {
        let (mut t, t1) = (t0.max(g.left), t1.min(g.right));
        if t >= t1 || g.cols == 0 {
            return;
        }
        // Usually the segment starts in the column being filled or the next one.
        let mut c = match self.col {
            Some(c) if t >= self.col_start && t < self.col_end => c,
            Some(c) if t >= self.col_end && c + 1 < g.cols && t < g.start(c + 2) => c + 1,
            _ => g.column(t),
        };
        loop {
            if self.col != Some(c) {
                self.flush();
                self.col = Some(c);
                self.col_start = g.start(c);
                self.col_end = g.start(c + 1);
            }
            let end = self.col_end.min(t1);
            self.acc[phase.index()] += end - t;
            t = end;
            if t >= t1 || c + 1 >= g.cols {
                break;
            }
            c += 1;
        }
    }
}

/// One stretch of one phase of one thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment {
    pub start_ns: u64,
    pub end_ns: u64,
    pub phase: Phase,
}

/// Each thread's phase segments of the last seconds, oldest first, in one contiguous run per
/// thread: a frame reads only the visible threads' segments inside the span (no hashing or
/// pointer chasing per step).
#[derive(Clone, Debug, Default)]
pub struct Segments {
    by_thread: HashMap<String, VecDeque<Segment>>,
}

impl Segments {
    /// Adds a step's phases, laid out in its role's order ending at its end (as traces do).
    pub fn push(&mut self, s: &StepSpan) {
        let q = match self.by_thread.get_mut(&s.thread) {
            Some(q) => q,
            None => self.by_thread.entry(s.thread.clone()).or_default(),
        };
        let mut t = s.end_ns.saturating_sub(s.wall_ns);
        for (phase, ns) in &s.phases {
            q.push_back(Segment {
                start_ns: t,
                end_ns: t + ns,
                phase: *phase,
            });
            t += ns;
        }
    }

    /// Drops the segments that ended before `from_ns`.
    pub fn trim(&mut self, from_ns: u64) {
        for q in self.by_thread.values_mut() {
            while q.front().is_some_and(|s| s.end_ns < from_ns) {
                q.pop_front();
            }
        }
    }

    pub fn of(&self, thread: &str) -> Option<&VecDeque<Segment>> {
        self.by_thread.get(thread)
    }

    pub fn len(&self) -> usize {
        self.by_thread.values().map(|q| q.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The oldest time kept.
    pub fn oldest_ns(&self) -> Option<u64> {
        self.by_thread
            .values()
            .filter_map(|q| q.front().map(|s| s.start_ns))
            .min()
    }

    /// A thread's segments from the first that ends inside `span` (the caller stops at the
    /// first that starts after it).
    fn starting_in(
        &self,
        thread: &str,
        span: TimeSpan,
    ) -> std::collections::vec_deque::Iter<'_, Segment> {
        match self.of(thread) {
            Some(q) => q.range(q.partition_point(|s| s.end_ns <= span.left_ns())..),
            None => Default::default(),
        }
    }
}

/// One lane per thread of `threads`, in that order, over `span` in `cols` columns. With
/// `now_ns`, a thread's phase in progress is drawn up to it (a stall shows as one long segment
/// reaching the right edge).
pub fn lanes(
    threads: &[&ThreadView],
    segments: &Segments,
    span: TimeSpan,
    cols: usize,
    now_ns: Option<u64>,
) -> Vec<Lane> {
    let grid = Grid::new(span, cols);
    threads
        .iter()
        .map(|t| {
            let mut b = LaneBuilder::new(cols);
            for s in segments.starting_in(&t.name, span) {
                if s.start_ns >= span.right_ns {
                    break;
                }
                b.add(&grid, s.start_ns, s.end_ns, s.phase);
            }
            let last_end = segments
                .of(&t.name)
                .and_then(|q| q.back())
                .map_or(0, |s| s.end_ns);
            if let Some(now) = now_ns.filter(|_| t.state != ThreadState::Exited) {
                let since = now.saturating_sub((t.phase_s.max(0.0) * 1e9) as u64);
                b.add(&grid, since.max(last_end), now, t.phase);
            }
            b.flush();
            Lane { cells: b.cells }
        })
        .collect()
}

/// Each thread's time in each phase per column of `span` (for stacked shares over time).
pub fn phase_columns(
    threads: &[&ThreadView],
    segments: &Segments,
    span: TimeSpan,
    cols: usize,
) -> Vec<Vec<[u64; N_PHASES]>> {
    let grid = Grid::new(span, cols);
    threads
        .iter()
        .map(|t| {
            let mut out = vec![[0u64; N_PHASES]; cols];
            for s in segments.starting_in(&t.name, span) {
                if s.start_ns >= span.right_ns {
                    break;
                }
                grid.each(s.start_ns, s.end_ns, |c, d| out[c][s.phase.index()] += d);
            }
            out
        })
        .collect()
}

/// A queue's depth per column as a share of its capacity (None before its history starts).
/// The history holds one mean depth per hub tick, the newest ending at `now_ns`.
pub fn queue_strip(q: &QueueView, span: TimeSpan, cols: usize, now_ns: u64) -> Vec<Option<f64>> {
    let cap = q.capacity.max(1) as f64;
    (0..cols)
        .map(|c| {
            let mid = span.col_start(c, cols) / 2 + span.col_start(c + 1, cols) / 2;
            if mid > now_ns {
                return None;
            }
            let back = ((now_ns - mid) / TICK_NS) as usize;
            let i = q.history.len().checked_sub(1 + back)?;
            Some((q.history[i] / cap).clamp(0.0, 1.0))
        })
        .collect()
}

/// The spans that have time inside `span`, for `e` (the trace of what is on screen).
pub fn spans_in<'a>(spans: impl Iterator<Item = &'a StepSpan>, span: TimeSpan) -> Vec<StepSpan> {
    spans.filter(|s| span.overlaps(s)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Role;

    fn step(end_ms: u64, phases: &[(Phase, u64)]) -> StepSpan {
        let wall = phases.iter().map(|p| p.1).sum::<u64>() * 1_000_000;
        StepSpan {
            thread: "drafter-0".into(),
            role: Role::Drafter,
            end_ns: end_ms * 1_000_000,
            wall_ns: wall,
            phases: phases.iter().map(|(p, ms)| (*p, ms * 1_000_000)).collect(),
        }
    }

    fn thread(phase: Phase, phase_s: f64) -> ThreadView {
        ThreadView {
            name: "drafter-0".into(),
            role: Role::Drafter,
            device: "cpu".into(),
            tid: 1,
            cpu_pct: None,
            phase,
            phase_s,
            state: ThreadState::Working,
            os_state: None,
            w1: Default::default(),
            w10: Default::default(),
            run: Default::default(),
        }
    }

    #[test]
    fn columns_take_the_phase_with_most_time() {
        // 0..100 ms in 10 columns of 10 ms: hs_wait 0..40, forward 40..55, backward 55..100.
        let s = step(
            100,
            &[
                (Phase::HsWait, 40),
                (Phase::Forward, 15),
                (Phase::Backward, 45),
            ],
        );
        let span = TimeSpan {
            right_ns: 100_000_000,
            width_ns: 100_000_000,
        };
        let mut segs = Segments::default();
        segs.push(&s);
        let l = lanes(&[&thread(Phase::HsWait, 0.0)], &segs, span, 10, None);
        use Phase::*;
        let want = [
            HsWait, HsWait, HsWait, HsWait, Forward, Backward, Backward, Backward, Backward,
            Backward,
        ];
        assert_eq!(l[0].cells, want.map(Some).to_vec());
    }

    #[test]
    fn the_phase_in_progress_reaches_now() {
        let s = step(20, &[(Phase::Forward, 20)]);
        let span = TimeSpan {
            right_ns: 100_000_000,
            width_ns: 100_000_000,
        };
        // In hs_wait for the last 50 ms; 20..50 ms is unknown.
        let mut segs = Segments::default();
        segs.push(&s);
        let l = lanes(
            &[&thread(Phase::HsWait, 0.05)],
            &segs,
            span,
            10,
            Some(100_000_000),
        );
        assert_eq!(l[0].cells[1], Some(Phase::Forward));
        assert_eq!(l[0].cells[3], None);
        assert!(l[0].cells[5..].iter().all(|c| *c == Some(Phase::HsWait)));
    }

    #[test]
    fn queue_strip_maps_ticks_to_columns() {
        let q = QueueView {
            capacity: 4,
            history: vec![0.0, 2.0, 4.0],
            ..Default::default()
        };
        let span = TimeSpan {
            right_ns: 1_000_000_000,
            width_ns: 500_000_000,
        };
        // Five columns of 100 ms: the last three ticks, oldest first; none before.
        let s = queue_strip(&q, span, 5, 1_000_000_000);
        assert_eq!(s, vec![None, None, Some(0.0), Some(0.5), Some(1.0)]);
    }
}
