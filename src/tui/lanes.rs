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
mod tests {
    use super::*;
    use crate::telemetry::Role;
    use crate::tui::segments::Segment;

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
            sizes: None,
        }
    }

    /// The span `[right - width, right)`, in ms.
    fn span_ms(right_ms: u64, width_ms: u64) -> TimeSpan {
        TimeSpan {
            right_ns: right_ms * 1_000_000,
            width_ns: width_ms * 1_000_000,
        }
    }

    fn segments_of(s: &StepSpan) -> Segments {
        let mut segs = Segments::default();
        segs.push(s);
        segs
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
        let span = span_ms(100, 100);
        let segs = segments_of(&s);
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
        let span = span_ms(100, 100);
        // In hs_wait for the last 50 ms; 20..50 ms is unknown.
        let segs = segments_of(&s);
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
    fn in_the_first_seconds_of_a_run_now_is_at_the_right_edge() {
        // The clock reads 3 s, the span is 10 s wide: 0..3 s fill the right 3 of 10 columns.
        let s = step(3_000, &[(Phase::Forward, 3_000)]);
        let span = span_ms(3_000, 10_000);
        let segs = segments_of(&s);
        let l = lanes(&[&thread(Phase::Forward, 0.0)], &segs, span, 10, None);
        let mut want = vec![None; 7];
        want.extend([Some(Phase::Forward); 3]);
        assert_eq!(l[0].cells, want);
        assert_eq!(span.column(2_999_999_999, 10), Some(9));
        assert_eq!(span.column(0, 10), Some(7));
    }

    /// Brute force: each column's phase with most time, the later phase on a tie.
    fn lane_by_brute_force(segs: &[Segment], span: TimeSpan, cols: usize) -> Vec<Option<Phase>> {
        let g = Grid::new(span, cols);
        (0..cols)
            .map(|c| {
                let (lo, hi) = (g.start(c), g.start(c + 1));
                let mut acc = [0u64; N_PHASES];
                for s in segs {
                    let (a, b) = (s.start_ns.max(lo), s.end_ns.min(hi));
                    if a < b {
                        acc[s.phase.index()] += b - a;
                    }
                }
                let (i, ns) = acc.iter().enumerate().max_by_key(|x| *x.1).unwrap();
                (*ns > 0).then(|| Phase::ALL[i])
            })
            .collect()
    }

    #[test]
    fn lanes_match_a_brute_force_count_per_column() {
        // Steps of random phases and lengths, back to back with random gaps, over random spans
        // and widths (columns narrower and wider than a segment, spans cutting steps).
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for case in 0..300 {
            let mut segs = Segments::default();
            let mut t = rnd(50_000_000);
            for _ in 0..rnd(60) {
                t += rnd(3) * rnd(10_000_000);
                let phases: Vec<(Phase, u64)> = (0..1 + rnd(6))
                    .map(|_| {
                        // Half the cases in whole milliseconds (ties, empty phases).
                        let ns = if case % 2 == 0 {
                            rnd(8_000_000)
                        } else {
                            rnd(4) * 1_000_000
                        };
                        (Phase::ALL[rnd(N_PHASES as u64) as usize], ns)
                    })
                    .collect();
                let wall: u64 = phases.iter().map(|p| p.1).sum();
                t += wall;
                segs.push(&StepSpan {
                    thread: "drafter-0".into(),
                    role: Role::Drafter,
                    end_ns: t,
                    wall_ns: wall,
                    phases,
                });
            }
            let span = TimeSpan {
                right_ns: rnd(t + 100_000_000),
                width_ns: 1 + rnd(400_000_000),
            };
            let cols = 1 + rnd(300) as usize;
            let all: Vec<Segment> = segs
                .of("drafter-0")
                .into_iter()
                .flatten()
                .copied()
                .collect();
            let l = lanes(&[&thread(Phase::Other, 0.0)], &segs, span, cols, None);
            let want = lane_by_brute_force(&all, span, cols);
            let g = Grid::new(span, cols);
            for (c, (got, want)) in l[0].cells.iter().zip(&want).enumerate() {
                let (lo, hi) = (g.start(c), g.start(c + 1));
                let near: Vec<_> = all
                    .iter()
                    .filter(|s| s.end_ns > lo && s.start_ns < hi)
                    .collect();
                assert_eq!(
                    got, want,
                    "case {case}: {span:?}, {cols} columns, column {c} [{lo}, {hi}): {near:?}"
                );
            }
        }
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
