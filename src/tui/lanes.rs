//! The timeline's model, no terminal: from the step spans of the last seconds, one lane per
//! thread cut into columns, each column the phase that took most of its time; the queue depths
//! and the verdict changes on the same time axis.

use crate::telemetry::snapshot::{QueueView, StepSpan, ThreadState, ThreadView};
use crate::telemetry::window::TICK_NS;
use crate::telemetry::{Phase, N_PHASES};

use super::segments::Segments;

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
}

/// Columns of a span on the hub's clock, in floating point (no division per segment). A span
/// wider than the clock's reading (the first seconds of a run) starts before 0: its leftmost
/// columns cover no time and the clock's 0 falls where it belongs, not at the left edge.
#[derive(Clone, Copy)]
struct Grid {
    left: u64,
    right: u64,
    /// How far before 0 the span starts.
    before_zero: u64,
    cols: usize,
    ns_per_col: f64,
}

impl Grid {
    fn new(span: TimeSpan, cols: usize) -> Grid {
        Grid {
            left: span.left_ns(),
            right: span.right_ns,
            before_zero: span.width_ns.saturating_sub(span.right_ns),
            cols,
            ns_per_col: span.width_ns as f64 / cols.max(1) as f64,
        }
    }

    fn start(&self, c: usize) -> u64 {
        if c >= self.cols {
            return self.right;
        }
        (self.left + (c as f64 * self.ns_per_col) as u64).saturating_sub(self.before_zero)
    }

    /// The column of `t`, which must lie in `[left, right)`.
    fn column(&self, t: u64) -> usize {
        let from_left = t - self.left + self.before_zero;
        let mut c = ((from_left as f64 / self.ns_per_col) as usize).min(self.cols - 1);
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

/// The start of each column of a grid and, last, its right edge (`cols + 1` values): computed
/// once a frame, so that moving to the next column is a load, not a multiplication.
fn bounds(g: &Grid) -> Vec<u64> {
    (0..=g.cols).map(|c| g.start(c)).collect()
}

/// A phase's time in a column and its index as one number that orders as the lane wants: more
/// time first, then the later phase (`max_by_key`'s tie rule). The low bits hold the index.
const PHASE_BITS: u32 = 5;
const _: () = assert!(N_PHASES <= 1 << PHASE_BITS);

#[inline]
fn rank(ns: u64, phase: usize) -> u64 {
    (ns.min(u64::MAX >> PHASE_BITS) << PHASE_BITS) | phase as u64
}

/// Builds lanes column by column, one sweep over the spans in the order they ended.
struct LaneBuilder<'b> {
    /// `cols + 1` column starts (see `bounds`).
    bounds: &'b [u64],
    cells: Vec<Option<Phase>>,
    col: Option<usize>,
    /// The current column's bounds: a segment inside them adds without any arithmetic.
    col_start: u64,
    col_end: u64,
    acc: [u64; N_PHASES],
    /// The highest `rank` in the current column so far: a flush reads the winner off it.
    best: u64,
}

impl<'b> LaneBuilder<'b> {
    fn new(bounds: &'b [u64]) -> LaneBuilder<'b> {
        LaneBuilder {
            bounds,
            cells: vec![None; bounds.len().saturating_sub(1)],
            col: None,
            col_start: 0,
            col_end: 0,
            acc: [0; N_PHASES],
            best: 0,
        }
    }

    fn cols(&self) -> usize {
        self.cells.len()
    }

    /// Ends the current column: the phase with most time in it (the later phase on a tie).
    fn flush(&mut self) {
        if let Some(c) = self.col.take() {
            let best = std::mem::take(&mut self.best);
            if best >> PHASE_BITS > 0 {
                self.cells[c] = Phase::from_index((best & ((1 << PHASE_BITS) - 1)) as usize);
            }
            self.acc = [0; N_PHASES];
        }
    }

    /// Adds `ns` of phase `i` to the current column.
    #[inline]
    fn count(&mut self, i: usize, ns: u64) {
        let sum = self.acc[i] + ns;
        self.acc[i] = sum;
        self.best = self.best.max(rank(sum, i));
    }

    /// Adds `[t0, t1)` of `phase`, clipped to the grid.
    #[inline]
    fn add(&mut self, t0: u64, t1: u64, phase: Phase) {
        // The common case: a segment within the column being filled (no arithmetic; the
        // bounds start empty, so the first segment takes the slow path).
        if t0 >= self.col_start && t1 <= self.col_end {
            self.count(phase.index(), t1 - t0);
        } else {
            self.add_across(t0, t1, phase);
        }
    }

    #[inline(never)]
    fn add_across(&mut self, t0: u64, t1: u64, phase: Phase) {
        let cols = self.cols();
        let (Some(&left), Some(&right)) = (self.bounds.first(), self.bounds.last()) else {
            return;
        };
        let (mut t, t1) = (t0.max(left), t1.min(right));
        if t >= t1 || cols == 0 {
            return;
        }
        // Usually the segment starts in the column being filled or the next one.
        let mut c = match self.col {
            Some(c) if t >= self.col_start && t < self.col_end => c,
            Some(c) if t >= self.col_end && c + 1 < cols && t < self.bounds[c + 2] => c + 1,
            // The last column starting at or before `t`.
            _ => self.bounds[1..cols].partition_point(|b| *b <= t),
        };
        loop {
            if self.col != Some(c) {
                self.flush();
                self.col = Some(c);
                self.col_start = self.bounds[c];
                self.col_end = self.bounds[c + 1];
            }
            let end = self.col_end.min(t1);
            self.count(phase.index(), end - t);
            t = end;
            if t >= t1 || c + 1 >= cols {
                break;
            }
            c += 1;
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
    let bounds = bounds(&Grid::new(span, cols));
    threads
        .iter()
        .map(|t| {
            let mut b = LaneBuilder::new(&bounds);
            let mut last_end = 0;
            if let Some(q) = segments.of(&t.name) {
                // Internal iteration: a loop over each of the deque's two slices.
                super::segments::after(q, span.left_ns())
                    .take_while(|s| s.start_ns < span.right_ns)
                    .for_each(|s| b.add(s.start_ns, s.end_ns, s.phase));
                last_end = q.back().map_or(0, |s| s.end_ns);
            }
            if let Some(now) = now_ns.filter(|_| t.state != ThreadState::Exited) {
                let since = now.saturating_sub((t.phase_s.max(0.0) * 1e9) as u64);
                b.add(since.max(last_end), now, t.phase);
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
            for s in segments.starting_in(&t.name, span.left_ns()) {
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
    let b = bounds(&Grid::new(span, cols));
    (0..cols)
        .map(|c| {
            let end = b[c + 1];
            let mid = b[c] / 2 + end / 2;
            // A column before the clock's 0 (the first seconds of a run) or after now.
            if end == 0 || mid > now_ns {
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
mod tests;
