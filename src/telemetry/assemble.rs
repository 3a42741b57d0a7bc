//! Turns the hub's accumulated state into a `Snapshot`. Pure apart from the time passed in, so
//! the windows, the verdict and the queue statistics can be tested on scripted input.

use super::phase::{Phase, Role};
use super::queue::{QueueCounters, QueueProbe};
use super::recorder::{StepRecord, ThreadInfo, MAX_SLOTS};
use super::snapshot::*;
use super::switches::Switches;
use super::verdict::{VerdictTracker, WaitShares};
use super::window::{QueueTick, Windows, RING_TICKS};
use crate::probe::cpu::CpuSample;
use crate::probe::gpu::GpuSample;
use crate::probe::owner::{owner, Worker};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

const W1: usize = 10;
const W10: usize = RING_TICKS;
/// Chart points kept (one a tick: 5 minutes).
const HISTORY: usize = 3000;
const GPU_HISTORY: usize = 120;

pub struct Assembler {
    start_ns: u64,
    last_tick_ns: u64,
    windows: Windows,
    verdict: VerdictTracker,
    cpu: Option<CpuSample>,
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
}

/// Spans kept between two snapshots at most (a burst beyond it is not traced).
const MAX_PENDING_SPANS: usize = 4096;

fn push_capped<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    q.push_back(v);
    while q.len() > cap {
        q.pop_front();
    }
}

impl Assembler {
    pub fn new(now_ns: u64) -> Self {
        Assembler {
            start_ns: now_ns,
            last_tick_ns: now_ns,
            windows: Windows::default(),
            verdict: VerdictTracker::default(),
            cpu: None,
            gpus: GpuPanel::default(),
            gpu_history: BTreeMap::new(),
            loss_history: VecDeque::new(),
            tok_history: VecDeque::new(),
            status: None,
            seq: 0,
            ns_per_mark: 0.0,
            pending: Vec::new(),
        }
    }

    pub fn ingest(&mut self, r: &StepRecord) {
        self.windows.ingest(r);
        if self.pending.len() < MAX_PENDING_SPANS {
            self.pending.push(*r);
        }
    }

    pub fn reset_windows(&mut self) {
        self.windows.reset();
        self.verdict.reset();
    }

    pub fn set_status(&mut self, s: String) {
        self.status = Some(s);
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
                    throttle: g.throttle.iter().map(|t| t.to_string()).collect(),
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
        let t0 = std::time::Instant::now();
        let counters: Vec<QueueCounters> = queues.iter().map(|q| q.read(now_ns)).collect();
        let span = now_ns.saturating_sub(self.last_tick_ns);
        self.last_tick_ns = now_ns;
        self.windows.close_tick(span, threads.len(), &counters);
        let mut snap = self.build(now_ns, threads, queues, switches, dropped);
        snap.self_cost.snapshot_us = t0.elapsed().as_secs_f64() * 1e6;
        snap
    }

    fn build(
        &mut self,
        now_ns: u64,
        threads: &[ThreadInfo],
        queues: &[QueueProbe],
        switches: &Switches,
        dropped: u64,
    ) -> Snapshot {
        let elapsed_s = now_ns.saturating_sub(self.start_ns) as f64 / 1e9;
        let mut thread_views: Vec<ThreadView> = threads
            .iter()
            .enumerate()
            .map(|(i, t)| self.thread_view(i, t))
            .collect();
        // Pipeline order: loader, targets, drafters; by name within a role.
        thread_views
            .sort_by(|a, b| (role_rank(a.role), &a.name).cmp(&(role_rank(b.role), &b.name)));
        let count_role = |role: &str| {
            threads
                .iter()
                .filter(|t| t.role.name() == role)
                .count()
                .max(1) as f64
        };
        let queue_views: Vec<QueueView> = queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let w = self.windows.queue(i, W1);
                let consumers = count_role(q.consumers());
                let producers = count_role(q.producers());
                queue_view(
                    q,
                    &w,
                    self.windows.queue_history(i, W10),
                    consumers,
                    producers,
                )
            })
            .collect();

        let shares = verdict_inputs(&queue_views);
        let verdict = if self.windows.ticks_closed() >= 3 && self.windows.latest.drafter_steps > 0 {
            self.verdict.update(shares)
        } else {
            self.verdict.shown()
        };

        let tokens = |ticks: usize| -> (u64, u64) {
            let (mut tok, mut span) = (0, 0);
            for (i, t) in threads.iter().enumerate() {
                if t.role == Role::Drafter {
                    let w = self.windows.thread(i, ticks);
                    tok += w.tokens;
                    span = span.max(w.span_ns);
                }
            }
            (tok, span)
        };
        let rate = |(tok, span): (u64, u64)| {
            if span == 0 {
                0.0
            } else {
                tok as f64 / (span as f64 / 1e9)
            }
        };
        let tok_per_s_1s = rate(tokens(W1));
        let tokens_total: u64 = threads
            .iter()
            .enumerate()
            .filter(|(_, t)| t.role == Role::Drafter)
            .map(|(i, _)| self.windows.thread_run(i).tokens)
            .sum();
        let m = self.windows.latest.metrics;
        if let Some(m) = m {
            push_capped(&mut self.loss_history, (elapsed_s, m.loss as f64), HISTORY);
        }
        if self.windows.latest.drafter_steps > 0 {
            push_capped(&mut self.tok_history, (elapsed_s, tok_per_s_1s), HISTORY);
        }
        let marks_per_s: f64 = thread_views
            .iter()
            .map(|t| t.w1.steps_per_s() * t.role.phases().len() as f64)
            .sum();
        self.seq += 1;
        Snapshot {
            seq: self.seq,
            elapsed_s,
            train: TrainView {
                step: m.map(|m| m.step).unwrap_or(0),
                loss: m.map(|m| m.loss),
                tau: m.map(|m| m.tau),
                lr: m.map(|m| m.lr),
                grad_norm: m.map(|m| m.grad_norm),
                slot_acc: m
                    .map(|m| m.slot_acc[..(m.block_size as usize).min(MAX_SLOTS)].to_vec())
                    .unwrap_or_default(),
                tokens_total,
                tok_per_s_1s,
                tok_per_s_10s: rate(tokens(W10)),
            },
            profiling: switches.profiling(),
            gpu_timing: Some(switches.gpu_timing()),
            paused: switches.paused(),
            verdict,
            groups: self.groups(threads),
            cpu_note: self
                .cpu
                .is_none()
                .then(|| "per-thread CPU: sampling…".to_string()),
            memory: self.memory(),
            threads: thread_views,
            queues: queue_views,
            gpus: self.gpus.clone(),
            loss_history: self.loss_history.iter().copied().collect(),
            tok_history: self.tok_history.iter().copied().collect(),
            self_cost: SelfCost {
                marks_per_s,
                ns_per_mark: self.ns_per_mark,
                snapshot_us: 0.0,
                dropped,
            },
            status: self.status.clone(),
            steps: self.spans(threads),
        }
    }

    fn spans(&mut self, threads: &[ThreadInfo]) -> Vec<StepSpan> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|r| {
                let t = threads.get(r.thread)?;
                let phases = t
                    .role
                    .phases()
                    .iter()
                    .map(|p| (*p, r.phase_ns[p.index()]))
                    .filter(|(_, ns)| *ns > 0)
                    .collect();
                Some(StepSpan {
                    thread: t.name.clone(),
                    role: t.role,
                    end_ns: r.end_ns,
                    wall_ns: r.wall_ns,
                    phases,
                })
            })
            .collect()
    }

    fn thread_view(&self, i: usize, t: &ThreadInfo) -> ThreadView {
        let cpu = self.cpu.as_ref().map(|c| &c.threads);
        let alive = cpu.map(|c| c.contains_key(&t.tid)).unwrap_or(true);
        let phase = Phase::from_index(t.current.load(Relaxed) as usize).unwrap_or(Phase::Other);
        let state = if !alive {
            ThreadState::Exited
        } else if phase.is_wait() {
            ThreadState::Waiting
        } else {
            ThreadState::Working
        };
        ThreadView {
            name: t.name.clone(),
            role: t.role,
            device: t.device.clone(),
            tid: t.tid,
            cpu_pct: cpu.and_then(|c| c.get(&t.tid)).map(|c| c.cpu_pct),
            phase,
            state,
            os_state: cpu.and_then(|c| c.get(&t.tid)).map(|c| c.state),
            w1: self.windows.thread(i, W1),
            w10: self.windows.thread(i, W10),
            run: self.windows.thread_run(i),
        }
    }

    /// Threads no worker registered, grouped by name and by the worker that drives them
    /// (libtorch's intra-op pool shares its creator's name; `pt_autograd_N` runs a drafter's
    /// backward on cuda:N).
    fn groups(&self, threads: &[ThreadInfo]) -> Vec<ThreadGroupView> {
        let Some(cpu) = &self.cpu else {
            return Vec::new();
        };
        let workers: Vec<Worker> = threads
            .iter()
            .map(|t| Worker {
                name: &t.name,
                role: t.role,
                device: &t.device,
            })
            .collect();
        let mut groups: BTreeMap<(Option<usize>, String), ThreadGroupView> = BTreeMap::new();
        for c in cpu.threads.values() {
            if threads.iter().any(|t| t.tid == c.tid) {
                continue;
            }
            let by = owner(&c.name, &workers);
            let g = groups
                .entry((by, c.name.clone()))
                .or_insert_with(|| ThreadGroupView {
                    name: c.name.clone(),
                    count: 0,
                    cpu_pct: 0.0,
                    owner: by.map(|i| threads[i].name.clone()),
                    states: Vec::new(),
                });
            g.count += 1;
            g.cpu_pct += c.cpu_pct;
            match g.states.iter_mut().find(|(s, _)| *s == c.state) {
                Some((_, n)) => *n += 1,
                None => g.states.push((c.state, 1)),
            }
        }
        let mut v: Vec<_> = groups.into_values().collect();
        for g in &mut v {
            g.states.sort();
        }
        v.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct));
        v
    }

    fn memory(&self) -> Option<MemoryView> {
        let m = self.cpu.as_ref()?.memory?;
        Some(MemoryView {
            rss_mib: m.rss_mib,
            host_used_mib: m.host_used_mib,
            host_total_mib: m.host_total_mib,
        })
    }
}

fn role_rank(r: Role) -> u8 {
    match r {
        Role::Loader => 0,
        Role::Target => 1,
        Role::Drafter => 2,
        Role::Hub => 3,
    }
}

fn share(ns: u64, span_ns: u64, threads: f64) -> f64 {
    if span_ns == 0 {
        return 0.0;
    }
    (ns as f64 / (span_ns as f64 * threads)).min(1.0)
}

fn queue_view(
    q: &QueueProbe,
    w: &QueueTick,
    history: Vec<f64>,
    consumers: f64,
    producers: f64,
) -> QueueView {
    let secs = w.span_ns as f64 / 1e9;
    let consumer_wait_share = share(w.pop_wait_ns, w.span_ns, consumers);
    let producer_wait_share = share(w.push_wait_ns, w.span_ns, producers);
    QueueView {
        name: q.name().to_string(),
        producers: q.producers().to_string(),
        consumers: q.consumers().to_string(),
        capacity: q.capacity(),
        depth: w.depth,
        min_depth: w.min_depth,
        max_depth: w.max_depth,
        mean_depth: w.mean_depth(),
        empty_share: share(w.empty_ns, w.span_ns, 1.0),
        full_share: share(w.full_ns, w.span_ns, 1.0),
        push_per_s: if secs > 0.0 {
            w.pushes as f64 / secs
        } else {
            0.0
        },
        pop_per_s: if secs > 0.0 {
            w.pops as f64 / secs
        } else {
            0.0
        },
        mean_age_ms: if w.pops > 0 {
            w.age_ns_sum as f64 / w.pops as f64 / 1e6
        } else {
            0.0
        },
        consumer_wait_share,
        producer_wait_share,
        history,
        starving: consumer_wait_share > super::verdict::ENTER,
        blocking: producer_wait_share > super::verdict::ENTER,
    }
}

/// The verdict's inputs from the two pipeline queues, found by who is on each side.
pub fn verdict_inputs(queues: &[QueueView]) -> WaitShares {
    let mut s = WaitShares::default();
    for q in queues {
        match (q.producers.as_str(), q.consumers.as_str()) {
            ("loader", "target") => s.targets_starved = q.consumer_wait_share,
            ("target", "drafter") => {
                s.drafters_starved = q.consumer_wait_share;
                s.targets_blocked = q.producer_wait_share;
            }
            _ => {}
        }
    }
    s
}
