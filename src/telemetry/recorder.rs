//! The per-thread phase recorder (ProfileStats). Each worker owns one; a phase mark is one clock
//! read into a fixed array. At the end of an iteration the worker sends one `StepRecord` with
//! `try_send`; a full channel only bumps the dropped counter. Nothing here is shared mutably
//! between threads: the only cross-thread writes are the thread's own published current phase and
//! the dropped counter, both atomics.

use super::clock;
use super::phase::{Phase, Role, N_PHASES};
use super::switches::Switches;
use crossbeam_channel::{Sender, TrySendError};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Block slots whose accuracy a drafter reports (block size 16 at most).
pub const MAX_SLOTS: usize = 16;

/// Training numbers a drafter attaches to its step record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainMetrics {
    pub loss: f32,
    pub tau: f32,
    pub lr: f32,
    pub grad_norm: f32,
    pub slot_acc: [f32; MAX_SLOTS],
    pub block_size: u8,
    /// The run's optimizer step after this update (continues across a resume).
    pub step: u64,
}

/// One iteration of one thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRecord {
    pub thread: usize,
    /// End of the iteration, ns on the profiler's clock.
    pub end_ns: u64,
    pub wall_ns: u64,
    /// Per-phase wall time; sums to `wall_ns` (`other` holds the remainder).
    pub phase_ns: [u64; N_PHASES],
    /// Whether phases were recorded for the whole iteration.
    pub profiled: bool,
    pub tokens: u64,
    pub metrics: Option<TrainMetrics>,
}

/// What the hub knows of a registered thread.
#[derive(Clone, Debug)]
pub struct ThreadInfo {
    pub name: String,
    pub role: Role,
    pub device: String,
    pub tid: i32,
    pub current: Arc<AtomicU8>,
}

/// Threads register here once, at start (never on the hot path).
#[derive(Default, Debug)]
pub struct Registry {
    threads: Mutex<Vec<ThreadInfo>>,
}

impl Registry {
    pub fn threads(&self) -> Vec<ThreadInfo> {
        self.threads.lock().expect("registry poisoned").clone()
    }

    fn add(&self, info: ThreadInfo) -> usize {
        let mut t = self.threads.lock().expect("registry poisoned");
        t.push(info);
        t.len() - 1
    }
}

/// The sending side every recorder gets: the channel, the dropped counter, the switches.
#[derive(Clone, Debug)]
pub struct RecordSink {
    pub(crate) tx: Sender<StepRecord>,
    pub(crate) dropped: Arc<AtomicU64>,
    pub(crate) switches: Arc<Switches>,
    pub(crate) registry: Arc<Registry>,
}

impl RecordSink {
    /// Registers the calling thread and returns its recorder. Call it on the worker thread.
    pub fn recorder(&self, role: Role, device: &str) -> PhaseRecorder {
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        let current = Arc::new(AtomicU8::new(Phase::Other as u8));
        let tid = current_tid();
        let thread = self.registry.add(ThreadInfo {
            name,
            role,
            device: device.to_string(),
            tid,
            current: current.clone(),
        });
        let now = clock::ticks();
        PhaseRecorder {
            thread,
            acc: [0; N_PHASES],
            current_phase: Phase::Other,
            last: now,
            iter_start: now,
            epoch: self.switches.profiling_epoch(),
            switches: self.switches.clone(),
            published: current,
            sink: self.clone(),
            _not_send: PhantomData,
        }
    }

    pub fn switches(&self) -> &Arc<Switches> {
        &self.switches
    }
}

/// The OS thread id of the caller (what /proc/self/task lists).
pub fn current_tid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// A worker's phase accounting. `!Send`: it belongs to the thread that registered it.
pub struct PhaseRecorder {
    thread: usize,
    acc: [u64; N_PHASES],
    current_phase: Phase,
    last: u64,
    iter_start: u64,
    /// The switches' profiling epoch when this step began.
    epoch: u64,
    switches: Arc<Switches>,
    published: Arc<AtomicU8>,
    sink: RecordSink,
    _not_send: PhantomData<*const ()>,
}

impl PhaseRecorder {
    /// Ends the current phase and starts `phase`. With profiling off: one relaxed load.
    #[inline]
    pub fn mark(&mut self, phase: Phase) {
        if !self.switches.profiling() {
            return;
        }
        let now = clock::ticks();
        self.acc[self.current_phase as usize] += now.wrapping_sub(self.last);
        self.last = now;
        self.current_phase = phase;
        self.published.store(phase as u8, Relaxed);
    }

    /// Ends the iteration: sends one record (dropped if the channel is full) and starts the next.
    pub fn end_step(&mut self, tokens: u64, metrics: Option<TrainMetrics>) {
        let now = clock::ticks();
        let mut phase_ns = [0u64; N_PHASES];
        let wall_ns = clock::ticks_to_ns(now.wrapping_sub(self.iter_start));
        let on = self.switches.profiling();
        let epoch = self.switches.profiling_epoch();
        let profiled = on && epoch == self.epoch;
        if on {
            self.acc[self.current_phase as usize] += now.wrapping_sub(self.last);
        }
        let mut covered = 0;
        for (i, t) in self.acc.iter().enumerate().skip(1) {
            phase_ns[i] = clock::ticks_to_ns(*t);
            covered += phase_ns[i];
        }
        // Rounding in the tick conversion can overshoot by a few ns; never by more than that.
        if covered > wall_ns {
            let excess = covered - wall_ns;
            let biggest = (1..N_PHASES).max_by_key(|&i| phase_ns[i]).unwrap_or(1);
            phase_ns[biggest] = phase_ns[biggest].saturating_sub(excess);
            covered = wall_ns;
        }
        phase_ns[Phase::Other as usize] = wall_ns - covered;
        let record = StepRecord {
            thread: self.thread,
            end_ns: clock::ticks_to_epoch_ns(now),
            wall_ns,
            phase_ns,
            profiled,
            tokens,
            metrics,
        };
        if let Err(TrySendError::Full(_)) = self.sink.tx.try_send(record) {
            self.sink.dropped.fetch_add(1, Relaxed);
        }
        self.acc = [0; N_PHASES];
        self.iter_start = now;
        self.last = now;
        self.current_phase = Phase::Other;
        self.epoch = epoch;
        self.published.store(Phase::Other as u8, Relaxed);
    }

    /// Starts a fresh iteration without reporting the time since the last one (after a pause).
    pub fn restart(&mut self) {
        let now = clock::ticks();
        self.acc = [0; N_PHASES];
        self.iter_start = now;
        self.last = now;
        self.current_phase = Phase::Other;
        self.epoch = self.switches.profiling_epoch();
        self.published.store(Phase::Other as u8, Relaxed);
    }
}
