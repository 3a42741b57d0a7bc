//! Turns the hub's accumulated state into a `Snapshot`. Pure apart from the time passed in, so
//! the windows, the verdict and the queue statistics can be tested on scripted input.

use super::host;
use super::live::LiveTime;
use super::names::Names;
use super::phase_recorder::{LiveRead, StepRecord, ThreadInfo, MAX_SLOTS};
use super::queue::{QueueCounters, QueueProbe};
use super::queue_view::{verdict_inputs, QueueFlags};
use super::snapshot::*;
use super::stall::RecentSteps;
use super::switches::{GpuTiming, Switches, Timing};
use super::verdict::{Verdict, VerdictTracker};
use super::window::{push_capped, Windows, RING_TICKS};
use crate::probe::allocator::AllocatorSample;
use crate::probe::cpu::CpuSample;
use crate::probe::gpu::GpuSample;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

const W1: usize = 10;
const W10: usize = RING_TICKS;
/// Chart points kept (one a tick: 5 minutes).
const HISTORY: usize = 3000;
const GPU_HISTORY: usize = 120;

/// What a tick is closed with: the time, the threads, the queues and their counters as read
/// now, the switches and the dropped-record count; and for the hub's taps, the caching
/// allocator as read now (the assembler leaves it to the hub).
#[derive(Clone, Copy)]
pub struct TickInput<'a> {
    pub now_ns: u64,
    pub threads: &'a [ThreadInfo],
    pub queues: &'a [QueueProbe],
    pub counters: &'a [QueueCounters],
    pub switches: &'a Switches,
    pub dropped: u64,
    pub allocator: &'a [AllocatorSample],
    /// The GPUs as NVML read them at this tick (about once a second; empty between).
    pub gpus: &'a [GpuSample],
}

pub struct Assembler {
    start_ns: u64,
    windows: Windows,
    /// GPU timing mode the phase windows of GPU threads hold.
    mode: Option<GpuTiming>,
    /// Whether each registered thread drives a GPU, by record index.
    on_gpu: Vec<bool>,
    /// Recent host steps per thread, for live time and the stall check.
    recent: RecentSteps,
    queue_flags: QueueFlags,
    /// Step spans that did not fit between two snapshots.
    spans_dropped: u64,
    verdict: VerdictTracker,
    cpu: Option<CpuSample>,
    /// Why per-thread CPU cannot be shown (e.g. /proc unreadable), once the probe knows.
    cpu_absent: Option<String>,
    gpus: GpuPanel,
    gpu_history: BTreeMap<u32, VecDeque<u32>>,
    loss_history: VecDeque<(f64, f64)>,
    tok_history: VecDeque<(f64, f64)>,
    status: Option<String>,
    seq: u64,
    /// Cost of one phase mark measured at start, ns.
    pub ns_per_mark: f64,
    /// Records since the last snapshot, handed out as `StepSpan`s.
    pending: Vec<StepRecord>,
    /// The names of the pipeline the threads belong to (their roles and phases).
    names: Arc<Names>,
}

/// Spans kept between two snapshots at most (a burst beyond it is not traced, and counted).
const MAX_PENDING_SPANS: usize = 4096;

impl Assembler {
    pub fn new(now_ns: u64) -> Self {
        Assembler {
            start_ns: now_ns,
            windows: Windows::new(now_ns),
            mode: None,
            on_gpu: Vec::new(),
            recent: RecentSteps::default(),
            queue_flags: QueueFlags::default(),
            spans_dropped: 0,
            verdict: VerdictTracker::default(),
            cpu: None,
            cpu_absent: None,
            gpus: GpuPanel::default(),
            gpu_history: BTreeMap::new(),
            loss_history: VecDeque::new(),
            tok_history: VecDeque::new(),
            status: None,
            seq: 0,
            ns_per_mark: 0.0,
            pending: Vec::new(),
            names: Arc::default(),
        }
    }

    /// Names the pipeline the threads belong to (a watched one's declared stages); the next
    /// snapshots carry them.
    pub fn set_names(&mut self, names: Arc<Names>) {
        self.names = names;
    }

    /// Takes a record. Its phases enter the windows only when it was profiled throughout and
    /// measured the way the thread's windows are now (host time, or the current GPU mode).
    pub fn ingest(&mut self, r: &StepRecord) {
        let phases = r.profiled && self.accepts(r);
        self.windows.ingest(r, phases);
        self.recent.push(r);
        if phases {
            if self.pending.len() < MAX_PENDING_SPANS {
                self.pending.push(*r);
            } else {
                self.spans_dropped += 1;
            }
        }
    }

    fn accepts(&self, r: &StepRecord) -> bool {
        let gpu = self.on_gpu.get(r.thread).copied().unwrap_or(false);
        match (gpu, self.mode) {
            (false, _) => true,
            (true, Some(mode)) => r.timing == Timing::of(mode),
            (true, None) => false,
        }
    }

    /// Follows the switches' GPU timing mode: on a change the GPU threads' phase windows start
    /// over, so that a bar never mixes two modes.
    fn follow_mode(&mut self, threads: &[ThreadInfo], mode: GpuTiming) {
        self.on_gpu = threads.iter().map(|t| t.on_gpu()).collect();
        if self.mode != Some(mode) {
            if self.mode.is_some() {
                let gpu = self.on_gpu.clone();
                self.windows
                    .forget_phases(&|i| gpu.get(i).copied().unwrap_or(false));
            }
            self.mode = Some(mode);
        }
    }

    /// How long a verdict change must hold before it is shown (`verdict_dwell` in the TOML).
    pub fn set_verdict_dwell(&mut self, dwell_ns: u64) {
        self.verdict = VerdictTracker::with_dwell(dwell_ns);
    }

    pub fn reset_windows(&mut self) {
        self.windows.reset();
        self.verdict.reset();
    }

    pub fn set_status(&mut self, s: String) {
        self.status = Some(s);
    }

    pub fn set_cpu_absent(&mut self, why: &str) {
        self.cpu_absent = Some(why.to_string());
    }

    pub fn set_cpu(&mut self, cpu: Option<CpuSample>) {
        if cpu.is_some() {
            self.cpu = cpu;
        }
    }

    pub fn set_gpu_absent(&mut self, why: &str) {
        self.gpus = GpuPanel::Absent(why.to_string());
    }

    pub fn set_gpus(&mut self, samples: Vec<GpuSample>) {
        self.set_gpus_of(None, samples)
    }

    /// `set_gpus` for the GPUs of `host` (another host's, as a watched process there sent
    /// them; none for this host's).
    pub fn set_gpus_of(&mut self, host: Option<&str>, samples: Vec<GpuSample>) {
        let views = samples
            .into_iter()
            .map(|g| {
                let h = self.gpu_history.entry(g.index).or_default();
                push_capped(h, g.util_pct, GPU_HISTORY);
                GpuView {
                    index: g.index,
                    name: g.name,
                    util_pct: g.util_pct,
                    mem_used_mib: g.mem_used_mib,
                    mem_total_mib: g.mem_total_mib,
                    power_w: g.power_w,
                    sm_clock_mhz: g.sm_clock_mhz,
                    temp_c: g.temp_c,
                    util_history: h.iter().copied().collect(),
                    cuda: g.cuda,
                    mem_bw_pct: g.mem_bw_pct,
                    proc_mem_mib: g.proc_mem_mib,
                    throttle: g.throttle,
                    host: host.map(String::from),
                }
            })
            .collect();
        self.gpus = GpuPanel::Present(views);
    }

    /// Closes a tick at `now_ns` and builds the snapshot.
    pub fn tick(
        &mut self,
        now_ns: u64,
        threads: &[ThreadInfo],
        queues: &[QueueProbe],
        switches: &Switches,
        dropped: u64,
    ) -> Snapshot {
        let counters: Vec<QueueCounters> = queues.iter().map(|q| q.read(now_ns)).collect();
        self.tick_read(&TickInput {
            now_ns,
            threads,
            queues,
            counters: &counters,
            switches,
            dropped,
            allocator: &[],
            gpus: &[],
        })
    }

    /// `tick` with the queues already read (the hub hands the same reading to its taps).
    pub fn tick_read(&mut self, input: &TickInput) -> Snapshot {
        let TickInput {
            now_ns,
            threads,
            queues,
            counters,
            switches,
            dropped,
            allocator: _,
            gpus: _,
        } = *input;
        let t0 = std::time::Instant::now();
        // Read once: a snapshot agrees with itself even if space is pressed while it is built.
        let paused = switches.paused();
        self.follow_mode(threads, switches.gpu_timing());
        self.windows
            .close_tick(now_ns, threads.len(), counters, paused);
        let mut snap = self.build(now_ns, threads, queues, switches, paused, dropped);
        snap.self_cost.snapshot_us = t0.elapsed().as_secs_f64() * 1e6;
        snap
    }

    fn build(
        &mut self,
        now_ns: u64,
        threads: &[ThreadInfo],
        queues: &[QueueProbe],
        switches: &Switches,
        paused: bool,
        dropped: u64,
    ) -> Snapshot {
        let elapsed_s = now_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let live: Vec<LiveRead> = threads.iter().map(|t| t.live.read()).collect();
        let stall_ns = self.recent.threshold_ns(threads.len());
        let lives = self.live_times(threads, &live, switches, paused, stall_ns);
        let thread_views = self.thread_views(threads, now_ns, &lives);
        let queue_views =
            self.queue_flags
                .views(&self.windows, W1, W10, threads, queues, &self.names);
        let stall = self
            .recent
            .stall(now_ns, threads, &live, stall_ns, &self.names);
        let verdict = self.verdict(now_ns, paused, stall.is_some(), &queue_views);
        let train = self.train_view(now_ns, threads, &lives);
        self.push_history(elapsed_s, train.tok_per_s_1s);
        let self_cost = self.self_cost(&thread_views, dropped);
        self.seq += 1;
        Snapshot {
            seq: self.seq,
            elapsed_s,
            now_ns,
            train,
            profiling: switches.profiling(),
            stage_ratio_flops: switches.stage_ratio_flops(),
            gpu_timing: threads
                .iter()
                .any(|t| t.on_gpu())
                .then(|| switches.gpu_timing()),
            paused,
            verdict,
            stall,
            groups: host::groups(self.cpu.as_ref(), threads),
            cpu_note: host::cpu_note(self.cpu.as_ref(), self.cpu_absent.as_deref()),
            memory: host::memory(self.cpu.as_ref()),
            threads: thread_views,
            queues: queue_views,
            gpus: self.gpus.clone(),
            cupti: switches.cupti(),
            allocator: Vec::new(),
            loss_history: self.loss_history.iter().copied().collect(),
            tok_history: self.tok_history.iter().copied().collect(),
            self_cost,
            status: self.status.clone(),
            alerts: Vec::new(),
            steps: self.spans(threads),
            warnings: Vec::new(),
            ranks: Vec::new(),
            names: self.names.clone(),
            sync_sites: Vec::new(),
        }
    }

    /// Paused or stalled first; otherwise the queues' verdict, judged once three ticks of
    /// running have closed since the first step (until then the one shown stays).
    fn verdict(
        &mut self,
        now_ns: u64,
        paused: bool,
        stalled: bool,
        queues: &[QueueView],
    ) -> Verdict {
        let judged = self.windows.ticks_closed() >= 3
            && self.recent.started()
            && !self.windows.last_paused();
        if paused || stalled || !judged {
            self.verdict.interrupt();
        }
        if paused {
            Verdict::Paused
        } else if stalled {
            Verdict::Stalled
        } else if judged {
            self.verdict
                .update(&verdict_inputs(queues, &self.names), now_ns)
        } else {
            self.verdict.shown()
        }
    }

    /// Training figures: the latest metrics, and tokens over time with the steps in progress
    /// prorated (steady whatever the step rate).
    fn train_view(
        &self,
        now_ns: u64,
        threads: &[ThreadInfo],
        lives: &[Option<LiveTime>],
    ) -> TrainView {
        let tokens = |ticks: usize| -> f64 {
            let from = self.windows.window_start(ticks);
            let span = now_ns.saturating_sub(from);
            let tok: f64 = threads
                .iter()
                .enumerate()
                .filter(|(_, t)| self.names.counts_tokens(t.role))
                .map(|(i, _)| {
                    let done = self.windows.thread(i, ticks).tokens;
                    let running = lives[i]
                        .as_ref()
                        .map(|l| l.in_window(now_ns, from).tokens)
                        .unwrap_or(0.0);
                    done + running
                })
                .sum();
            if span == 0 {
                0.0
            } else {
                tok / (span as f64 / 1e9)
            }
        };
        let tokens_total: u64 = threads
            .iter()
            .enumerate()
            .filter(|(_, t)| self.names.counts_tokens(t.role))
            .map(|(i, _)| self.windows.thread_run(i).tokens.round() as u64)
            .sum();
        let m = self.windows.latest.metrics;
        TrainView {
            step: m.map(|m| m.step).unwrap_or(0),
            loss: m.and_then(|m| m.loss),
            tau: m.and_then(|m| m.tau),
            lr: m.and_then(|m| m.lr),
            grad_norm: m.and_then(|m| m.grad_norm),
            skipped_nonfinite: m.map(|m| m.skipped_nonfinite).unwrap_or(0),
            slot_acc: m
                .map(|m| m.slot_acc[..(m.block_size as usize).min(MAX_SLOTS)].to_vec())
                .unwrap_or_default(),
            tokens_total,
            tok_per_s_1s: tokens(W1),
            tok_per_s_10s: tokens(W10),
        }
    }

    /// Adds this tick's points to the loss and tok/s charts.
    fn push_history(&mut self, elapsed_s: f64, tok_per_s_1s: f64) {
        if let Some(loss) = self.windows.latest.metrics.and_then(|m| m.loss) {
            push_capped(&mut self.loss_history, (elapsed_s, loss as f64), HISTORY);
        }
        if self.windows.latest.drafter_steps > 0 {
            push_capped(&mut self.tok_history, (elapsed_s, tok_per_s_1s), HISTORY);
        }
    }

    /// What the profiler costs (the snapshot's own time is filled in by `tick_read`).
    fn self_cost(&self, threads: &[ThreadView], dropped: u64) -> SelfCost {
        let marks_per_s: f64 = threads
            .iter()
            .map(|t| t.w1.steps_per_s() * self.names.phases(t.role).len() as f64)
            .sum();
        SelfCost {
            marks_per_s,
            ns_per_mark: self.ns_per_mark,
            snapshot_us: 0.0,
            dropped,
            spans_dropped: self.spans_dropped,
        }
    }
}

mod threads;
