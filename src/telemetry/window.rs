//! Rolling windows. Records are spread over the ticks their span covers; a closed tick goes into
//! a ring of the last `RING_TICKS`; the 1 s and 10 s windows are sums over the newest ticks of
//! that ring and the run window is a running total. Pure: time comes in as arguments, so tests
//! can script it.

use super::phase_recorder::{StepRecord, TrainMetrics};
use super::queue::QueueCounters;
use super::snapshot::PhaseWindow;
use std::collections::VecDeque;

/// The hub's tick: 100 ms.
pub const TICK_NS: u64 = 100_000_000;
/// Ticks kept: 10 s.
pub const RING_TICKS: usize = 100;

/// Queue activity over one tick (differences of cumulative counters).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueTick {
    pub span_ns: u64,
    pub pushes: u64,
    pub pops: u64,
    pub push_wait_ns: u64,
    pub pop_wait_ns: u64,
    pub depth_ns: u128,
    pub empty_ns: u64,
    pub full_ns: u64,
    pub age_ns_sum: u64,
    pub depth: usize,
    pub min_depth: usize,
    pub max_depth: usize,
}

impl QueueTick {
    fn between(prev: &QueueCounters, now: &QueueCounters) -> QueueTick {
        QueueTick {
            span_ns: now.at_ns.saturating_sub(prev.at_ns),
            // Counters of another process (a viewer's, a recording's) may go backwards: a
            // restarted producer, a damaged file. That reads as nothing done, never a wrap.
            pushes: now.pushes.saturating_sub(prev.pushes),
            pops: now.pops.saturating_sub(prev.pops),
            push_wait_ns: now.push_wait_ns.saturating_sub(prev.push_wait_ns),
            pop_wait_ns: now.pop_wait_ns.saturating_sub(prev.pop_wait_ns),
            depth_ns: now.depth_ns.saturating_sub(prev.depth_ns),
            empty_ns: now.empty_ns.saturating_sub(prev.empty_ns),
            full_ns: now.full_ns.saturating_sub(prev.full_ns),
            age_ns_sum: now.age_ns_sum.saturating_sub(prev.age_ns_sum),
            depth: now.depth,
            min_depth: now.min_depth,
            max_depth: now.max_depth,
        }
    }

    pub fn add(&mut self, o: &QueueTick) {
        self.span_ns += o.span_ns;
        self.pushes += o.pushes;
        self.pops += o.pops;
        self.push_wait_ns += o.push_wait_ns;
        self.pop_wait_ns += o.pop_wait_ns;
        self.depth_ns += o.depth_ns;
        self.empty_ns += o.empty_ns;
        self.full_ns += o.full_ns;
        self.age_ns_sum += o.age_ns_sum;
        self.depth = o.depth;
        self.min_depth = self.min_depth.min(o.min_depth);
        self.max_depth = self.max_depth.max(o.max_depth);
    }

    pub fn mean_depth(&self) -> f64 {
        if self.span_ns == 0 {
            return self.depth as f64;
        }
        self.depth_ns as f64 / self.span_ns as f64
    }
}

#[derive(Clone, Debug, Default)]
struct Tick {
    start_ns: u64,
    end_ns: u64,
    /// Training was paused at some point of this tick: its time is neither work nor wait.
    paused: bool,
    threads: Vec<PhaseWindow>,
    queues: Vec<QueueTick>,
}

/// Latest training numbers, kept across ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct LatestMetrics {
    pub metrics: Option<TrainMetrics>,
    pub drafter_steps: u64,
}

/// Phase time of a thread's step that has not ended, already cut to one window (live time).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InFlight {
    pub phase_ns: [u64; crate::telemetry::N_PHASES],
    /// The share of a typical step that the in-flight time stands for, 0..1.
    pub step_share: f64,
    /// Tokens the step will bring, prorated like `step_share`.
    pub tokens: f64,
}

/// Rolling windows over closed ticks. A step's record is spread over the ticks its span covers
/// (not lumped into the tick where it ended), so a long phase or wait lands where it happened;
/// the part that fell in a paused tick is dropped.
#[derive(Debug, Default)]
pub struct Windows {
    open: Tick,
    ring: VecDeque<Tick>,
    run: Vec<PhaseWindow>,
    prev_queue: Vec<Option<QueueCounters>>,
    pub latest: LatestMetrics,
}

/// Appends `v` to a history of at most `cap` items, dropping the oldest.
pub fn push_capped<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    q.push_back(v);
    while q.len() > cap {
        q.pop_front();
    }
}

fn grow<T: Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize_with(len, T::default);
    }
}

/// Adds `part` (0..=1) of record `r` to window `w`; phases only when `phases`.
fn add_part(w: &mut PhaseWindow, r: &StepRecord, part: f64, phases: bool) {
    w.tokens += r.tokens as f64 * part;
    w.note_entered(&r.phase_ns, &r.phase_n);
    if phases {
        w.phase_steps += part;
        w.gpu_idle_ns += (r.gpu_idle_ns as f64 * part).round() as u64;
        for (acc, n) in w.phase_n.iter_mut().zip(r.phase_n) {
            *acc += n as f64 * part;
        }
        let mut wall = 0;
        for (acc, ns) in w.phase_ns.iter_mut().zip(r.phase_ns) {
            let x = (ns as f64 * part).round() as u64;
            *acc += x;
            wall += x;
        }
        w.wall_ns += wall;
    }
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> u64 {
    a.1.min(b.1).saturating_sub(a.0.max(b.0))
}

impl Windows {
    /// Windows whose first tick opens at `now_ns`.
    pub fn new(now_ns: u64) -> Windows {
        let mut w = Windows::default();
        w.open.start_ns = now_ns;
        w
    }

    /// Takes a record: its steps count in the open tick; its tokens and (when `phases`) its
    /// phase times are spread over the ticks its span covers.
    pub fn ingest(&mut self, r: &StepRecord, phases: bool) {
        let thread = r.thread;
        grow(&mut self.open.threads, thread + 1);
        grow(&mut self.run, thread + 1);
        self.open.threads[thread].steps += r.steps as u64;
        self.run[thread].steps += r.steps as u64;
        // Host syncs and CUDA calls count with the steps, where the step ended (per step, not
        // per time).
        for w in [&mut self.open.threads[thread], &mut self.run[thread]] {
            for (acc, n) in w.host_syncs.iter_mut().zip(r.host_syncs) {
                *acc += n as u64;
            }
            if let Some(c) = &r.cuda_calls {
                w.cuda_steps += r.steps as u64;
                w.cuda_calls.add(c);
            }
        }
        if let Some(m) = r.metrics {
            self.latest.metrics = Some(m);
            self.latest.drafter_steps += 1;
        }
        let span = (r.start_ns(), r.end_ns);
        if r.wall_ns == 0 {
            add_part(&mut self.open.threads[thread], r, 1.0, phases);
            add_part(&mut self.run[thread], r, 1.0, phases);
            return;
        }
        let wall = r.wall_ns as f64;
        // What falls before the oldest tick kept still counts in the run totals.
        let mut kept = 1.0;
        let open_part = span.1.saturating_sub(span.0.max(self.open.start_ns)) as f64 / wall;
        add_part(&mut self.open.threads[thread], r, open_part, phases);
        for t in self.ring.iter_mut().rev() {
            if t.end_ns <= span.0 {
                break;
            }
            let part = overlap(span, (t.start_ns, t.end_ns)) as f64 / wall;
            if t.paused {
                kept -= part;
                continue;
            }
            grow(&mut t.threads, thread + 1);
            add_part(&mut t.threads[thread], r, part, phases);
        }
        add_part(&mut self.run[thread], r, kept.max(0.0), phases);
    }

    /// Closes the open tick at `now_ns` with the queues read as `queues`; `paused` says whether
    /// training was paused during it.
    pub fn close_tick(
        &mut self,
        now_ns: u64,
        n_threads: usize,
        queues: &[QueueCounters],
        paused: bool,
    ) {
        let start = self.open.start_ns;
        let mut tick = std::mem::replace(
            &mut self.open,
            Tick {
                start_ns: now_ns.max(start),
                ..Default::default()
            },
        );
        tick.end_ns = now_ns.max(start);
        tick.paused = paused;
        grow(&mut tick.threads, n_threads);
        let span_ns = tick.end_ns - tick.start_ns;
        for w in &mut tick.threads {
            w.span_ns = span_ns;
            if paused {
                // Steps still count; time in a paused tick is neither work nor wait.
                let steps = w.steps;
                let tokens = w.tokens;
                let host_syncs = w.host_syncs;
                let (cuda_steps, cuda_calls) = (w.cuda_steps, w.cuda_calls);
                *w = PhaseWindow {
                    steps,
                    tokens,
                    host_syncs,
                    cuda_steps,
                    cuda_calls,
                    span_ns,
                    ..Default::default()
                };
            }
        }
        grow(&mut self.prev_queue, queues.len());
        tick.queues = queues
            .iter()
            .zip(self.prev_queue.iter_mut())
            .map(|(now, prev)| {
                let t = match prev {
                    Some(p) if !paused => QueueTick::between(p, now),
                    _ => QueueTick {
                        span_ns: if paused { 0 } else { span_ns },
                        depth: now.depth,
                        min_depth: now.min_depth,
                        max_depth: now.max_depth,
                        ..Default::default()
                    },
                };
                *prev = Some(*now);
                t
            })
            .collect();
        grow(&mut self.run, tick.threads.len());
        for (run, w) in self.run.iter_mut().zip(&tick.threads) {
            run.span_ns += w.span_ns;
        }
        self.ring.push_back(tick);
        while self.ring.len() > RING_TICKS {
            self.ring.pop_front();
        }
    }

    /// Thread `i` over the newest `ticks` closed ticks.
    pub fn thread(&self, i: usize, ticks: usize) -> PhaseWindow {
        let mut w = PhaseWindow::default();
        for t in self.ring.iter().rev().take(ticks) {
            match t.threads.get(i) {
                Some(x) => w.add(x),
                None => w.span_ns += t.end_ns - t.start_ns,
            }
        }
        w
    }

    pub fn thread_run(&self, i: usize) -> PhaseWindow {
        self.run.get(i).copied().unwrap_or_default()
    }

    /// Start of the window of the newest `ticks` closed ticks, ns.
    pub fn window_start(&self, ticks: usize) -> u64 {
        let n = ticks.min(self.ring.len());
        match self.ring.len().checked_sub(n) {
            Some(i) if n > 0 => self.ring[i].start_ns,
            _ => self.open.start_ns,
        }
    }

    /// Whether the newest closed tick was paused.
    pub fn last_paused(&self) -> bool {
        self.ring.back().is_some_and(|t| t.paused)
    }

    /// Forgets the phase times of the threads `which` selects, keeping steps and tokens (a new
    /// GPU timing mode: a bar never mixes two).
    pub fn forget_phases(&mut self, which: &dyn Fn(usize) -> bool) {
        let ticks = self.ring.iter_mut().chain(std::iter::once(&mut self.open));
        for t in ticks {
            for (i, w) in t.threads.iter_mut().enumerate() {
                if which(i) {
                    w.clear_phases();
                }
            }
        }
        for (i, w) in self.run.iter_mut().enumerate() {
            if which(i) {
                w.clear_phases();
            }
        }
    }

    /// Queue `i` over the newest `ticks` closed ticks.
    pub fn queue(&self, i: usize, ticks: usize) -> QueueTick {
        let mut q = QueueTick {
            min_depth: usize::MAX,
            ..Default::default()
        };
        let skip = self.ring.len().saturating_sub(ticks);
        for t in self.ring.iter().skip(skip) {
            if let Some(x) = t.queues.get(i) {
                q.add(x);
            }
        }
        if q.min_depth == usize::MAX {
            q.min_depth = q.depth;
        }
        q
    }

    /// Mean depth of queue `i` in each of the newest `ticks` ticks, oldest first.
    pub fn queue_history(&self, i: usize, ticks: usize) -> Vec<f64> {
        let skip = self.ring.len().saturating_sub(ticks);
        self.ring
            .iter()
            .skip(skip)
            .map(|t| t.queues.get(i).map(|q| q.mean_depth()).unwrap_or(0.0))
            .collect()
    }

    pub fn ticks_closed(&self) -> usize {
        self.ring.len()
    }

    /// Forgets the windows (the `r` key); the run totals stay.
    /// `r`: the 1 s and 10 s windows start over, and so do the run window's phase times (its
    /// steps and tokens are the run's totals, kept).
    pub fn reset(&mut self) {
        self.ring.clear();
        for w in &mut self.run {
            w.clear_phases();
        }
        let start = self.open.start_ns;
        self.open = Tick {
            start_ns: start,
            ..Default::default()
        };
    }
}
