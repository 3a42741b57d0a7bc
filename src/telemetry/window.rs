//! Rolling windows. Records are summed into the open tick; a closed tick goes into a ring of the
//! last `RING_TICKS`; the 1 s and 10 s windows are sums over the newest ticks of that ring and the
//! run window is a running total. Pure: time comes in as arguments, so tests can script it.

use super::queue::QueueCounters;
use super::recorder::{StepRecord, TrainMetrics};
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
            pushes: now.pushes - prev.pushes,
            pops: now.pops - prev.pops,
            push_wait_ns: now.push_wait_ns - prev.push_wait_ns,
            pop_wait_ns: now.pop_wait_ns - prev.pop_wait_ns,
            depth_ns: now.depth_ns - prev.depth_ns,
            empty_ns: now.empty_ns - prev.empty_ns,
            full_ns: now.full_ns - prev.full_ns,
            age_ns_sum: now.age_ns_sum - prev.age_ns_sum,
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
    threads: Vec<PhaseWindow>,
    queues: Vec<QueueTick>,
}

/// Latest training numbers, kept across ticks.
#[derive(Clone, Copy, Debug, Default)]
pub struct LatestMetrics {
    pub metrics: Option<TrainMetrics>,
    pub drafter_steps: u64,
}

#[derive(Debug, Default)]
pub struct Windows {
    open: Tick,
    ring: VecDeque<Tick>,
    run: Vec<PhaseWindow>,
    prev_queue: Vec<Option<QueueCounters>>,
    pub latest: LatestMetrics,
}

fn grow<T: Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len {
        v.resize_with(len, T::default);
    }
}

impl Windows {
    pub fn ingest(&mut self, r: &StepRecord) {
        grow(&mut self.open.threads, r.thread + 1);
        let w = &mut self.open.threads[r.thread];
        w.steps += 1;
        w.wall_ns += r.wall_ns;
        w.tokens += r.tokens;
        for (acc, ns) in w.phase_ns.iter_mut().zip(r.phase_ns) {
            *acc += ns;
        }
        if let Some(m) = r.metrics {
            self.latest.metrics = Some(m);
            self.latest.drafter_steps += 1;
        }
    }

    /// Closes the open tick: `span_ns` of wall clock passed, queues read as `queues`.
    pub fn close_tick(&mut self, span_ns: u64, n_threads: usize, queues: &[QueueCounters]) {
        let mut tick = std::mem::take(&mut self.open);
        grow(&mut tick.threads, n_threads);
        for w in &mut tick.threads {
            w.span_ns = span_ns;
        }
        grow(&mut self.prev_queue, queues.len());
        tick.queues = queues
            .iter()
            .zip(self.prev_queue.iter_mut())
            .map(|(now, prev)| {
                let t = match prev {
                    Some(p) => QueueTick::between(p, now),
                    None => QueueTick {
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
            run.add(w);
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
            if let Some(x) = t.threads.get(i) {
                w.add(x);
            } else {
                w.span_ns += TICK_NS;
            }
        }
        w
    }

    pub fn thread_run(&self, i: usize) -> PhaseWindow {
        self.run.get(i).copied().unwrap_or_default()
    }

    /// Queue `i` over the newest `ticks` closed ticks.
    pub fn queue(&self, i: usize, ticks: usize) -> QueueTick {
        let mut q = QueueTick {
            min_depth: usize::MAX,
            ..Default::default()
        };
        for t in self
            .ring
            .iter()
            .rev()
            .take(ticks)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
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
    pub fn reset(&mut self) {
        self.ring.clear();
        self.open = Tick::default();
    }
}
