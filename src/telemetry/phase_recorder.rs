//! The per-thread phase recorder (ProfileStats). Each worker owns one; a phase mark is one clock
//! read into a fixed array. At the end of an iteration the worker sends one `StepRecord` with
//! `try_send`; a full channel only bumps the dropped counter. Nothing here is shared mutably
//! between threads: the only cross-thread writes are the thread's own published live step (its
//! current phase, when it began, the phases so far) and the dropped counter, all atomics.

use super::clock;
use super::phase::{Phase, Role, N_PHASES};
use super::switches::{Switches, Timing};
use crossbeam_channel::{Sender, TrySendError};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Block slots whose accuracy a drafter reports (block size 16 at most).
pub const MAX_SLOTS: usize = 16;

/// Training numbers a drafter attaches to its step record. A number a pipeline does not report
/// is None (shown as absent, never as a zero); recordings that carry them read as before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TrainMetrics {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tau: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f32>,
    pub slot_acc: [f32; MAX_SLOTS],
    pub block_size: u8,
    /// The run's optimizer step after this update (continues across a resume).
    pub step: u64,
    /// Steps skipped so far in this run for a non-finite loss or gradient (no update made).
    #[serde(default)]
    pub skipped_nonfinite: u64,
}

/// The CUDA API calls a thread made in one iteration, where CUPTI counts them (our engine with
/// `--cupti`, src/engine/gpu/cupti.rs): kernel launches, and the CPU time spent inside launch and
/// synchronize calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaCalls {
    pub launches: u64,
    pub launch_ns: u64,
    pub sync_ns: u64,
}

impl CudaCalls {
    pub fn add(&mut self, other: &CudaCalls) {
        self.launches = self.launches.saturating_add(other.launches);
        self.launch_ns = self.launch_ns.saturating_add(other.launch_ns);
        self.sync_ns = self.sync_ns.saturating_add(other.sync_ns);
    }
}

/// One iteration of one thread (a host record), or the device times of an earlier one.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepRecord {
    pub thread: usize,
    /// End of the iteration on the host, ns on the profiler's clock.
    pub end_ns: u64,
    pub wall_ns: u64,
    /// Per-phase time; sums to `wall_ns` (`other` holds the remainder).
    pub phase_ns: [u64; N_PHASES],
    /// Whether `phase_ns` holds the whole iteration's phases (profiling on throughout and, in
    /// `events` mode, the device record rather than the host one).
    pub profiled: bool,
    /// How `phase_ns` was measured.
    pub timing: Timing,
    /// Iterations this record ends: 1 for a host record, 0 for device times that follow one.
    pub steps: u32,
    /// Device records: the part of `wall_ns` when the GPU sat idle waiting for the host.
    pub gpu_idle_ns: u64,
    pub tokens: u64,
    pub metrics: Option<TrainMetrics>,
    /// Times each phase was entered in the iteration, where the producer counts them (a Python
    /// pipeline's host syncs); zeros otherwise.
    pub phase_n: [u32; N_PHASES],
    /// Times the iteration read the device back to the host (waiting for it), by the phase it
    /// was in, where the producer counts them (our engine); zeros otherwise.
    pub host_syncs: [u32; N_PHASES],
    /// The iteration's CUDA launches and time in launch and sync calls, where CUPTI counted
    /// them on this thread; None otherwise (a CPU thread, no libcupti, `--cupti off`).
    pub cuda_calls: Option<CudaCalls>,
}

impl StepRecord {
    /// Start of the span the record covers, ns on the profiler's clock.
    pub fn start_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.wall_ns)
    }
}

/// What a worker publishes about the iteration it is in, for live time: the hub credits a phase
/// or a queue wait that is still running up to now, instead of only when it ends. Plain relaxed
/// stores on the mark path; a reader may see a mark half applied, for one tick at most.
#[derive(Debug, Default)]
pub struct LiveStep {
    pub phase: AtomicU8,
    /// Tick reading when the current phase began.
    pub phase_start: AtomicU64,
    /// Tick reading when the current iteration began.
    pub step_start: AtomicU64,
    /// Ticks spent in each phase of the current iteration before the current phase began.
    pub acc: [AtomicU64; N_PHASES],
}

/// A `LiveStep` read at one moment, in ns on the profiler's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LiveRead {
    pub phase: Phase,
    pub phase_start_ns: u64,
    pub step_start_ns: u64,
    /// Time in each phase of the step before the current phase began.
    pub acc_ns: [u64; N_PHASES],
}

impl LiveStep {
    pub fn phase(&self) -> Phase {
        Phase::from_index(self.phase.load(Relaxed) as usize).unwrap_or(Phase::Other)
    }

    pub fn read(&self) -> LiveRead {
        let mut acc_ns = [0; N_PHASES];
        for (out, a) in acc_ns.iter_mut().zip(&self.acc) {
            *out = clock::ticks_to_ns(a.load(Relaxed));
        }
        LiveRead {
            phase: self.phase(),
            phase_start_ns: clock::ticks_to_epoch_ns(self.phase_start.load(Relaxed)),
            step_start_ns: clock::ticks_to_epoch_ns(self.step_start.load(Relaxed)),
            acc_ns,
        }
    }

    /// Sets the live step as of scripted times (ns on the profiler's clock), for tests.
    pub fn script(&self, phase: Phase, step_start_ns: u64, phase_start_ns: u64) {
        self.set(phase, step_start_ns, phase_start_ns, &[0; N_PHASES]);
    }

    /// Sets the whole live step from a reading taken elsewhere (another process's, for a
    /// viewer): times in ns on this profiler's clock.
    pub fn set(&self, phase: Phase, step_start_ns: u64, phase_start_ns: u64, acc_ns: &[u64]) {
        for (a, ns) in self.acc.iter().zip(acc_ns) {
            a.store(clock::ns_to_ticks(*ns), Relaxed);
        }
        self.step_start
            .store(clock::epoch_ns_to_ticks(step_start_ns), Relaxed);
        self.phase_start
            .store(clock::epoch_ns_to_ticks(phase_start_ns), Relaxed);
        self.phase.store(phase as u8, Relaxed);
    }

    fn restart(&self, now: u64) {
        for a in &self.acc {
            a.store(0, Relaxed);
        }
        self.step_start.store(now, Relaxed);
        self.phase_start.store(now, Relaxed);
        self.phase.store(Phase::Other as u8, Relaxed);
    }
}

/// What the hub knows of a registered thread.
#[derive(Clone, Debug)]
pub struct ThreadInfo {
    pub name: String,
    pub role: Role,
    pub device: String,
    pub tid: i32,
    pub live: Arc<LiveStep>,
}

impl ThreadInfo {
    /// Whether the thread drives a GPU (GPU timing modes apply to it).
    pub fn on_gpu(&self) -> bool {
        self.device.starts_with("cuda")
    }
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

    /// Adds a thread; returns its index (what its step records carry). Workers go through
    /// `RecordSink::recorder`; a viewer adds the threads of the process it watches.
    pub fn add(&self, info: ThreadInfo) -> usize {
        let mut t = self.threads.lock().expect("registry poisoned");
        t.push(info);
        t.len() - 1
    }

    /// Gives thread `i` another role (a watched producer re-declared its stages).
    pub fn set_role(&self, i: usize, role: Role) {
        if let Some(t) = self.threads.lock().expect("registry poisoned").get_mut(i) {
            t.role = role;
        }
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
        let now = clock::ticks();
        let live = Arc::new(LiveStep::default());
        live.restart(now);
        let tid = current_tid();
        let thread = self.registry.add(ThreadInfo {
            name,
            role,
            device: device.to_string(),
            tid,
            live: live.clone(),
        });
        PhaseRecorder {
            thread,
            acc: [0; N_PHASES],
            current_phase: Phase::Other,
            last: now,
            iter_start: now,
            epoch: self.switches.profiling_epoch(),
            switches: self.switches.clone(),
            live,
            sink: self.clone(),
            host_syncs: [0; N_PHASES],
            cuda_calls: None,
            _not_send: PhantomData,
        }
    }

    pub fn switches(&self) -> &Arc<Switches> {
        &self.switches
    }

    /// Hands a record to the hub (dropped and counted when its channel is full).
    pub fn send(&self, record: StepRecord) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(record) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }
}

use crate::probe::current_tid;

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
    live: Arc<LiveStep>,
    sink: RecordSink,
    /// Host syncs of the iteration so far, by phase (`add_host_syncs`).
    host_syncs: [u32; N_PHASES],
    /// CUDA calls of the iteration, where counted (`set_cuda_calls`).
    cuda_calls: Option<CudaCalls>,
    _not_send: PhantomData<*const ()>,
}

/// Per-phase nanoseconds from per-phase ticks, `other` taking what no phase covers, so that the
/// phases sum to `wall_ns` exactly.
fn phases_to_ns(acc: &[u64; N_PHASES], wall_ns: u64) -> [u64; N_PHASES] {
    let mut phase_ns = [0u64; N_PHASES];
    let mut covered = 0;
    for (i, t) in acc.iter().enumerate().skip(1) {
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
    phase_ns[Phase::Other as usize] = wall_ns.saturating_sub(covered);
    phase_ns
}

impl PhaseRecorder {
    /// Ends the current phase and starts `phase`. With profiling off: one relaxed load.
    #[inline]
    pub fn mark(&mut self, phase: Phase) {
        if !self.switches.profiling() {
            return;
        }
        let now = clock::ticks();
        let i = self.current_phase as usize;
        self.acc[i] += clock::elapsed(self.last, now);
        self.live.acc[i].store(self.acc[i], Relaxed);
        self.last = now;
        self.current_phase = phase;
        self.live.phase_start.store(now, Relaxed);
        self.live.phase.store(phase as u8, Relaxed);
    }

    /// The phase being recorded now.
    pub fn current(&self) -> Phase {
        self.current_phase
    }

    /// Adds host syncs, by phase, to the iteration in progress (its record carries them).
    pub fn add_host_syncs(&mut self, by_phase: &[u32; N_PHASES]) {
        for (acc, n) in self.host_syncs.iter_mut().zip(by_phase) {
            *acc = acc.saturating_add(*n);
        }
    }

    /// Sets the CUDA calls the iteration made (its record carries them; None: not counted).
    pub fn set_cuda_calls(&mut self, calls: Option<CudaCalls>) {
        self.cuda_calls = calls;
    }

    /// Ends the iteration with host-timed phases: sends one record (dropped if the channel is
    /// full) and starts the next.
    pub fn end_step(&mut self, tokens: u64, metrics: Option<TrainMetrics>) {
        self.end_step_timed(tokens, metrics, Timing::Host, true);
    }

    /// Ends the iteration; `host_phases` false means the phase times follow later as a device
    /// record (`events` mode), so this one carries only steps, tokens and metrics. Returns the
    /// iteration's end (ns on the profiler's clock) for that later record.
    pub fn end_step_timed(
        &mut self,
        tokens: u64,
        metrics: Option<TrainMetrics>,
        timing: Timing,
        host_phases: bool,
    ) -> u64 {
        let now = clock::ticks();
        let wall_ns = clock::ticks_to_ns(clock::elapsed(self.iter_start, now));
        let on = self.switches.profiling();
        let epoch = self.switches.profiling_epoch();
        if on {
            self.acc[self.current_phase as usize] += clock::elapsed(self.last, now);
        }
        let end_ns = clock::ticks_to_epoch_ns(now);
        self.sink.send(StepRecord {
            thread: self.thread,
            end_ns,
            wall_ns,
            phase_ns: phases_to_ns(&self.acc, wall_ns),
            profiled: on && epoch == self.epoch && host_phases,
            timing,
            steps: 1,
            gpu_idle_ns: 0,
            tokens,
            metrics,
            phase_n: [0; N_PHASES],
            host_syncs: std::mem::take(&mut self.host_syncs),
            cuda_calls: self.cuda_calls.take(),
        });
        self.acc = [0; N_PHASES];
        self.iter_start = now;
        self.last = now;
        self.current_phase = Phase::Other;
        self.epoch = epoch;
        self.live.restart(now);
        end_ns
    }

    /// Sends device-measured phase times of an iteration that ended at `end_ns` on the host, of
    /// which `idle_ns` the GPU sat idle waiting for the host.
    pub fn send_device_step(
        &self,
        end_ns: u64,
        phase_ns: [u64; N_PHASES],
        idle_ns: u64,
        timing: Timing,
    ) {
        self.sink.send(StepRecord {
            thread: self.thread,
            end_ns,
            wall_ns: phase_ns.iter().sum(),
            phase_ns,
            profiled: true,
            timing,
            steps: 0,
            gpu_idle_ns: idle_ns,
            tokens: 0,
            metrics: None,
            phase_n: [0; N_PHASES],
            host_syncs: [0; N_PHASES],
            cuda_calls: None,
        });
    }

    /// Starts a fresh iteration without reporting the time since the last one (after a pause).
    pub fn restart(&mut self) {
        let now = clock::ticks();
        self.acc = [0; N_PHASES];
        self.host_syncs = [0; N_PHASES];
        self.cuda_calls = None;
        self.iter_start = now;
        self.last = now;
        self.current_phase = Phase::Other;
        self.epoch = self.switches.profiling_epoch();
        self.live.restart(now);
    }
}

#[cfg(test)]
mod tests;
