//! The hub's thread (src/telemetry/hub.rs): step records ingested as they arrive, commands
//! applied, and every 100 ms a tick that reads the CPU and the GPUs at their own rates, the
//! queues and the caching allocator, assembles a snapshot, checks the warning rules on it and
//! publishes it.

use super::{measure_mark_cost, HubCommand, RawTap, Telemetry};
use crate::cancel::CancelToken;
use crate::probe::cpu::CpuProbe;
use crate::probe::gpu::{GpuProbe, GpuSample};
use crate::telemetry::allocator::{self, AllocatorTrack};
use crate::telemetry::assemble::{Assembler, TickInput};
use crate::telemetry::clock;
use crate::telemetry::phase_recorder::StepRecord;
use crate::telemetry::queue::QueueCounters;
use crate::telemetry::warnings::Warnings;
use crate::telemetry::window::TICK_NS;
use crossbeam_channel::{select, tick};
use std::sync::Arc;
use std::time::Duration;

const CPU_EVERY_TICKS: u64 = 5;
const GPU_EVERY_TICKS: u64 = 5;

/// What the hub's thread keeps from tick to tick.
struct HubLoop {
    asm: Assembler,
    cpu: Option<CpuProbe>,
    gpu: GpuProbe,
    /// The caching allocator of this process only (a viewer's own would be a fake number).
    allocator: Option<AllocatorTrack>,
    rules: Warnings,
    taps: Vec<Arc<dyn RawTap>>,
    /// Ticks so far.
    n: u64,
}

impl Telemetry {
    pub(super) fn run_hub(&self, cancel: CancelToken) {
        let mut hub = HubLoop::new(self);
        let ticker = tick(Duration::from_nanos(TICK_NS));
        loop {
            select! {
                recv(self.rx) -> r => if let Ok(r) = r {
                    hub.ingest(&r);
                },
                recv(self.commands.1) -> c => match c.ok().and_then(|c| self.apply(c)) {
                    Some(HubCommand::ResetWindows) => hub.asm.reset_windows(),
                    Some(HubCommand::Status(s)) => {
                        hub.taps.iter().for_each(|t| t.status(&s));
                        hub.asm.set_status(s)
                    }
                    _ => {}
                },
                recv(ticker) -> _ => {
                    let stopping = cancel.is_cancelled();
                    hub.tick(self);
                    if stopping {
                        return;
                    }
                }
            }
        }
    }
}

impl HubLoop {
    /// The assembler and the probes for `t`'s hub (none where `t.probes` is off).
    fn new(t: &Telemetry) -> HubLoop {
        let mut asm = Assembler::new(clock::now_ns());
        asm.ns_per_mark = t.ns_per_mark.unwrap_or_else(measure_mark_cost);
        asm.set_verdict_dwell(t.verdict_dwell_ns);
        let cpu = t.probes.then(|| CpuProbe::of(t.watched_pid));
        let taps = t.taps();
        let gpu = if t.probes {
            GpuProbe::open_for(t.watched_pid)
        } else {
            GpuProbe::Absent(String::new())
        };
        if let GpuProbe::Absent(why) = &gpu {
            asm.set_gpu_absent(why);
        }
        let allocator = (t.probes && t.watched_pid.is_none()).then(AllocatorTrack::default);
        HubLoop {
            asm,
            cpu,
            gpu,
            allocator,
            rules: Warnings::new(t.warnings.clone()),
            taps,
            n: 0,
        }
    }

    fn ingest(&mut self, r: &StepRecord) {
        self.asm.ingest(r);
        self.taps.iter().for_each(|t| t.record(r));
    }

    /// One tick: the records waiting, the probes due, then the snapshot, published.
    fn tick(&mut self, t: &Telemetry) {
        while let Ok(r) = t.rx.try_recv() {
            self.ingest(&r);
        }
        self.n += 1;
        let gpus_read = self.sample(t);
        let now = clock::now_ns();
        let threads = t.sink.registry.threads();
        let queues = t.queue_probes();
        let counters: Vec<QueueCounters> = queues.iter().map(|q| q.read(now)).collect();
        let alloc = match self.allocator {
            Some(_) => allocator::read(&threads),
            None => Vec::new(),
        };
        let input = TickInput {
            now_ns: now,
            threads: &threads,
            queues: &queues,
            counters: &counters,
            switches: &t.sink.switches,
            dropped: t.dropped(),
            allocator: &alloc,
            gpus: &gpus_read,
        };
        self.taps.iter().for_each(|tap| tap.tick(&input));
        self.asm.set_names(t.names());
        let mut snap = self.asm.tick_read(&input);
        snap.alerts = t.alerts();
        snap.allocator = match self.allocator.as_mut() {
            Some(a) => a.update(now, alloc),
            None => t.remote_allocator(),
        };
        snap.sync_sites = t.sync_sites();
        snap.warnings = self.rules.check(&snap);
        t.publish(snap);
    }

    /// The CPU and this host's GPUs when due, another host's GPUs as a watched process's samples
    /// bring them; returns this host's GPU reading of this tick (none where none was due).
    fn sample(&mut self, t: &Telemetry) -> Vec<GpuSample> {
        let n = self.n;
        if let Some(p) = self.cpu.as_mut().filter(|_| n % CPU_EVERY_TICKS == 1) {
            self.asm.set_cpu(p.sample());
            if let Some(why) = p.unavailable() {
                self.asm.set_cpu_absent(why);
            }
        }
        // This host's GPUs once a second (handed to the taps, which send them to viewers
        // elsewhere), or another host's as its samples bring them.
        let mut gpus_read = Vec::new();
        if n % GPU_EVERY_TICKS == 1 {
            if let Ok(g) = self.gpu.sample() {
                gpus_read = g.clone();
                self.asm.set_gpus(g);
            }
        }
        if let Some((host, g)) = t.take_remote_gpus() {
            self.asm.set_gpus_of(Some(&host), g);
        }
        gpus_read
    }
}
