//! The viewer's side of the stream: messages become the input of a local hub — threads in its
//! registry, records on its channel, live steps and queue counters where its probes read them,
//! the switches and the caching allocator's figures as the producer reports them — so that the
//! hub, and every front-end after it, works on a watched process exactly as on our own pipeline.

use super::protocol::*;
use crate::probe::allocator::AllocatorSample;
use crate::probe::gpu::GpuSample;
use crate::telemetry::allocator::AllocatorTrack;
use crate::telemetry::clock;
use crate::telemetry::names::Names;
use crate::telemetry::phase_recorder::{LiveStep, StepRecord, ThreadInfo};
use crate::telemetry::queue::{QueueCounters, QueueProbe};
use crate::telemetry::snapshot::SyncSite;
use crate::telemetry::stages::{StageTable, TableError};
use crate::telemetry::{HubCommand, Phase, Role, Telemetry, N_PHASES};
use anyhow::{bail, Result};
use std::sync::Arc;

struct RemoteThread {
    local: usize,
    name: String,
    /// Its stage's name, as declared (its role follows the table when that is declared again).
    stage: String,
    role: Role,
    live: Arc<LiveStep>,
}

pub struct Mirror {
    telemetry: Telemetry,
    /// The producer's stage table, its names and the role of each of its stages: thread
    /// declarations name their stage in it (declared names win over ours).
    stages: StageTable,
    names: Arc<Names>,
    roles: Vec<Role>,
    threads: Vec<Option<RemoteThread>>,
    queues: Vec<Option<QueueProbe>>,
    /// Added to a wire timestamp before it becomes local time (a replay's shift to now).
    shift_ns: i128,
    remote_dropped: u64,
    wire_dropped: u64,
    seen_sample: bool,
    /// The producer's clock is another host's (a socket forwarded with `ssh -L`): its first
    /// sample sets the shift to this host's clock, and steps before it are let go.
    other_host: bool,
    /// Under which host's name the GPUs in the producer's samples are shown: another host's,
    /// or a recording's; none where this host's NVML reads them.
    gpus_of: Option<String>,
    /// The producer's allocator figures, rated over its recent samples.
    allocator: AllocatorTrack,
    /// Each thread's host syncs by call site, as its latest sample that carried them said.
    sites: std::collections::BTreeMap<u32, Vec<SyncSite>>,
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// Entry counts by index in `role`'s list, into the per-phase array.
fn counts(names: &Names, role: Role, n: &[(u16, u32)]) -> [u32; N_PHASES] {
    let list = names.phases(role);
    let mut out = [0u32; N_PHASES];
    for (k, c) in n {
        if let Some(p) = list.get(*k as usize) {
            out[p.index()] = out[p.index()].saturating_add(*c);
        }
    }
    out
}

/// Phase times by index in `role`'s list, into the per-phase array (`other` the rest of `wall`).
fn phases(names: &Names, role: Role, ph: &[(u16, u64)], wall: u64) -> [u64; N_PHASES] {
    let list = names.phases(role);
    let mut out = [0u64; N_PHASES];
    for (k, ns) in ph {
        if let Some(p) = list.get(*k as usize).filter(|p| **p != Phase::Other) {
            out[p.index()] += ns;
        }
    }
    let covered: u64 = out.iter().sum();
    out[Phase::Other.index()] = wall.saturating_sub(covered);
    out
}

impl Mirror {
    /// Checks the hello; its stage table's names become `telemetry`'s (its snapshots carry them).
    pub fn new(hello: &Hello, telemetry: &Telemetry, shift_ns: i128) -> Result<Mirror> {
        let (names, roles) = match hello.stages.resolve() {
            Ok(resolved) => resolved,
            // A producer whose stages appear as it runs (zero-code mode) may start with none.
            Err(TableError::Empty) => (Names::builtin(), Vec::new()),
            Err(e) => bail!(
                "process {} declares stages this viewer cannot show: {e}",
                hello.pid
            ),
        };
        let names = Arc::new(names);
        telemetry.set_names(names.clone());
        telemetry.switches().set_cupti(hello.cupti.clone());
        Ok(Mirror {
            telemetry: telemetry.clone(),
            stages: hello.stages.clone(),
            names,
            roles,
            threads: Vec::new(),
            queues: Vec::new(),
            shift_ns,
            remote_dropped: 0,
            wire_dropped: 0,
            seen_sample: false,
            other_host: false,
            gpus_of: None,
            allocator: AllocatorTrack::default(),
            sites: Default::default(),
        })
    }

    /// The producer runs on another host: its CLOCK_MONOTONIC is not ours, so its times are
    /// moved by the difference its first sample shows (the forwarding's latency included).
    pub fn on_other_host(&mut self, host: &str) {
        self.other_host = true;
        self.show_gpus_of(host);
    }

    /// Shows the GPUs the producer's samples carry, under `host`'s name (a replay does: the
    /// recording's GPUs, not this host's).
    pub fn show_gpus_of(&mut self, host: &str) {
        self.gpus_of = Some(host.to_string());
    }

    /// Moves later wire times by `delta_ns` (a replay skipping a long gap).
    pub fn shift(&mut self, delta_ns: i128) {
        self.shift_ns += delta_ns;
    }

    /// A wire timestamp on this process's clock.
    pub fn local(&self, wire_ns: u64) -> u64 {
        clock::from_monotonic((wire_ns as i128 + self.shift_ns).max(0) as u64)
    }

    fn thread(&self, id: u32) -> Option<&RemoteThread> {
        self.threads.get(id as usize)?.as_ref()
    }

    /// Applies one message; one outside the protocol's bounds (`Msg::check`) is let go.
    pub fn apply(&mut self, m: Msg) {
        if m.check().is_err() {
            return;
        }
        match m {
            Msg::Thread(t) => self.add_thread(t),
            Msg::Queue(q) => self.add_queue(q),
            Msg::Step(s) => self.step(s),
            Msg::Sample(s) => self.sample(s),
            Msg::Status { text } => self.telemetry.command(HubCommand::Status(text)),
            Msg::Dropped { frames } => {
                self.wire_dropped = frames;
                self.telemetry
                    .set_dropped(self.remote_dropped + self.wire_dropped);
            }
            Msg::Hello(h) => self.restage(h),
            Msg::Command { .. } | Msg::Refused { .. } | Msg::Unknown => {}
        }
    }

    /// A later hello: a producer whose stages and phases appear as it runs (zero-code mode)
    /// declares its grown table. Its names become the telemetry's and every thread takes the role
    /// of its stage in it; a table that cannot be shown, or one that drops a stage of a thread,
    /// is let go.
    fn restage(&mut self, h: Hello) {
        if h.stages == self.stages {
            return;
        }
        let known = |t: &RemoteThread| h.stages.stages.iter().any(|s| s.name == t.stage);
        if !self.threads.iter().flatten().all(known) {
            return;
        }
        let Ok((names, roles)) = h.stages.resolve() else {
            return;
        };
        self.stages = h.stages;
        self.names = Arc::new(names);
        self.roles = roles;
        self.telemetry.set_names(self.names.clone());
        let registry = self.telemetry.registry().clone();
        for t in self.threads.iter_mut().flatten() {
            if let Some(role) = self.stages.role_of(&self.roles, &t.stage) {
                t.role = role;
                registry.set_role(t.local, role);
            }
        }
    }

    fn add_thread(&mut self, t: ThreadDecl) {
        let Some(role) = self.stages.role_of(&self.roles, &t.stage) else {
            return;
        };
        // A thread is declared once: a repeated id adds nothing (else a stream of them would
        // grow the registry without end).
        if self.thread(t.id).is_some() {
            return;
        }
        let live = Arc::new(LiveStep::default());
        let now = clock::now_ns();
        live.script(Phase::Other, now, now);
        let name = t.name.clone();
        let local = self.telemetry.registry().add(ThreadInfo {
            name: t.name,
            role,
            device: t.device,
            tid: t.tid,
            live: live.clone(),
        });
        let id = t.id as usize;
        if self.threads.len() <= id {
            self.threads.resize_with(id + 1, || None);
        }
        self.threads[id] = Some(RemoteThread {
            local,
            name: name.clone(),
            stage: t.stage,
            role,
            live,
        });
    }

    fn add_queue(&mut self, q: QueueDecl) {
        if matches!(self.queues.get(q.id as usize), Some(Some(_))) {
            return;
        }
        let probe = QueueProbe::remote(&q.name, q.capacity, leak(&q.producer), leak(&q.consumer));
        self.telemetry.add_queue(probe.clone());
        let id = q.id as usize;
        if self.queues.len() <= id {
            self.queues.resize_with(id + 1, || None);
        }
        self.queues[id] = Some(probe);
    }

    fn step(&mut self, s: WireStep) {
        if self.other_host && !self.seen_sample {
            return;
        }
        let Some(t) = self.thread(s.th) else { return };
        let record = StepRecord {
            thread: t.local,
            end_ns: self.local(s.end),
            wall_ns: s.wall,
            phase_ns: phases(&self.names, t.role, &s.ph, s.wall),
            profiled: s.prof,
            timing: s.timing,
            steps: s.steps,
            gpu_idle_ns: s.idle,
            tokens: s.tok,
            metrics: s.m,
            phase_n: counts(&self.names, t.role, &s.n),
            host_syncs: counts(&self.names, t.role, &s.sy),
            cuda_calls: s.cu,
        };
        self.telemetry.sink().send(record);
    }

    fn sample(&mut self, s: Sample) {
        if self.other_host && !self.seen_sample {
            self.shift_ns = clock::to_monotonic(clock::now_ns()) as i128 - s.now as i128;
        }
        let sw = self.telemetry.switches();
        if !self.seen_sample || sw.profiling() != s.prof {
            sw.set_profiling(s.prof);
        }
        sw.set_gpu_timing(s.timing);
        sw.set_paused(s.paused);
        self.seen_sample = true;
        let mut sites_changed = false;
        for l in &s.live {
            let Some(t) = self.thread(l.th) else { continue };
            if !l.sites.is_empty() {
                let name = t.name.clone();
                let sites = l.sites.iter().map(|(at, op, count, ns)| SyncSite {
                    thread: name.clone(),
                    at: at.clone(),
                    op: op.clone(),
                    count: *count,
                    ns: *ns,
                    steps: l.steps,
                });
                let sites = sites.collect();
                self.sites.insert(l.th, sites);
                sites_changed = true;
            }
            let Some(t) = self.thread(l.th) else { continue };
            let list = self.names.phases(t.role);
            let phase = list.get(l.ph as usize).copied().unwrap_or(Phase::Other);
            let acc = phases(&self.names, t.role, &l.acc, 0);
            t.live.set(phase, self.local(l.ss), self.local(l.ps), &acc);
        }
        for q in &s.q {
            let Some(Some(probe)) = self.queues.get(q.id as usize) else {
                continue;
            };
            probe.set_remote(QueueCounters {
                at_ns: self.local(q.at),
                depth: q.depth,
                pushes: q.push,
                pops: q.pop,
                push_wait_ns: q.push_wait,
                pop_wait_ns: q.pop_wait,
                depth_ns: q.depth_ns as u128,
                empty_ns: q.empty,
                full_ns: q.full,
                age_ns_sum: q.age_sum,
                min_depth: q.min,
                max_depth: q.max,
            });
        }
        if sites_changed {
            let all = self.sites.values().flatten().cloned().collect();
            self.telemetry.set_sync_sites(all);
        }
        let alloc = s.alloc.iter().map(AllocatorSample::from).collect();
        let mut views = self.allocator.update(self.local(s.now), alloc);
        if self.gpus_of.is_some() {
            // Another host's cuda:N (or a recording's) is not this host's cuda:N: the allocator
            // goes with the GPUs the samples bring.
            views.iter_mut().for_each(|v| v.host = self.gpus_of.clone());
        }
        self.telemetry.set_remote_allocator(views);
        if let (Some(host), false) = (&self.gpus_of, s.gpu.is_empty()) {
            let gpus = s.gpu.iter().map(GpuSample::from).collect();
            self.telemetry.set_remote_gpus(host.clone(), gpus);
        }
        self.remote_dropped = s.dropped;
        self.telemetry
            .set_dropped(self.remote_dropped + self.wire_dropped);
    }
}

#[cfg(test)]
mod tests;
