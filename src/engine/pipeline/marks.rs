//! Phase marks of a worker, with the GPU timing modes applied: on a CUDA device every worker runs
//! on a stream of its own (from libtorch's pool); `sync` waits for that stream at each mark
//! (never for the whole device, so a worker sharing the GPU is not waited for); `events` records a
//! CUDA event at each mark from a fixed pool and reads the device times back steps later, never
//! blocking; `async` only reads the host clock.

use crate::cancel::CancelToken;
use crate::engine::gpu::cuda::{Event, Stream};
use crate::telemetry::phase_recorder::{PhaseRecorder, TrainMetrics};
use crate::telemetry::switches::Timing;
use crate::telemetry::{GpuTiming, Phase, Switches, N_PHASES};
use anyhow::Result;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tch::Device;

/// Events in a worker's pool: at about a dozen marks a step, some 80 steps in flight.
pub const EVENT_POOL: usize = 1024;
/// Marks a step may hold; beyond it the step's device times are not reported (and counted).
const MARKS_PER_STEP: usize = 48;

/// One mark's event: the phase it starts, its event, and whether the worker's stream had run dry
/// when the host got there (the phase before it ended with the GPU waiting for the host).
#[derive(Clone, Copy, Debug)]
struct MarkEvent {
    phase: Phase,
    event: usize,
    drained: bool,
}

struct PendingStep {
    /// The event that closed the previous step (the start of this one on the device).
    start: Option<usize>,
    marks: Vec<MarkEvent>,
    end: Option<(usize, bool)>,
    host_end_ns: u64,
    complete: bool,
}

/// Device time per phase from a pool of CUDA events, read back without blocking.
pub struct EventTimer {
    events: Vec<Event>,
    next: usize,
    in_use: usize,
    current: Vec<MarkEvent>,
    current_complete: bool,
    pending: VecDeque<PendingStep>,
    spare: Vec<Vec<MarkEvent>>,
    last_end: Option<usize>,
    /// Steps whose device times could not be reported (pool or mark list full, a CUDA error).
    pub lost: u64,
}

/// A step's device times: per phase, and the part when the GPU sat idle waiting for the host.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceStep {
    pub host_end_ns: u64,
    pub phase_ns: [u64; N_PHASES],
    pub idle_ns: u64,
}

impl EventTimer {
    pub fn new() -> Result<EventTimer> {
        let events = (0..EVENT_POOL)
            .map(|_| Event::new(true))
            .collect::<Result<Vec<_>>>()?;
        Ok(EventTimer {
            events,
            next: 0,
            in_use: 0,
            current: Vec::with_capacity(MARKS_PER_STEP),
            current_complete: true,
            pending: VecDeque::with_capacity(EVENT_POOL / 4),
            spare: Vec::new(),
            last_end: None,
            lost: 0,
        })
    }

    /// Takes the next free event (events are freed in the order they are taken).
    fn take(&mut self) -> Option<usize> {
        if self.in_use == self.events.len() {
            return None;
        }
        let i = self.next;
        self.next = (self.next + 1) % self.events.len();
        self.in_use += 1;
        Some(i)
    }

    fn record(&mut self, stream: &Stream) -> Option<(usize, bool)> {
        let drained = stream.is_idle().unwrap_or(false);
        let i = self.take()?;
        match self.events[i].record(stream) {
            Ok(()) => Some((i, drained)),
            Err(_) => {
                self.current_complete = false;
                Some((i, drained))
            }
        }
    }

    pub fn mark(&mut self, phase: Phase, stream: &Stream) {
        if self.current.len() == MARKS_PER_STEP {
            self.current_complete = false;
            return;
        }
        match self.record(stream) {
            Some((event, drained)) => self.current.push(MarkEvent {
                phase,
                event,
                drained,
            }),
            None => self.current_complete = false,
        }
    }

    /// Closes the step in progress with an event; its times are read once that event is done.
    pub fn end_step(&mut self, stream: &Stream, host_end_ns: u64) {
        let end = self.record(stream);
        let complete = self.current_complete && end.is_some() && !self.current.is_empty();
        let marks = std::mem::replace(
            &mut self.current,
            self.spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(MARKS_PER_STEP)),
        );
        self.pending.push_back(PendingStep {
            start: self.last_end,
            marks,
            end,
            host_end_ns,
            complete,
        });
        self.last_end = end.map(|(e, _)| e);
        self.current_complete = true;
    }

    /// Forgets the step in progress (profiling or the mode changed mid-step).
    pub fn abandon_step(&mut self) {
        if !self.current.is_empty() || self.last_end.is_some() {
            // Its events were taken: queue them so that they are freed in the order taken; the
            // next step starts without a device start.
            let marks = std::mem::take(&mut self.current);
            self.pending.push_back(PendingStep {
                start: self.last_end.take(),
                marks,
                end: None,
                host_end_ns: 0,
                complete: false,
            });
        }
        self.current_complete = true;
    }

    fn last_event(step: &PendingStep) -> Option<usize> {
        step.end
            .map(|(e, _)| e)
            .or(step.marks.last().map(|m| m.event))
    }

    /// The oldest finished step's device times, if its last event is done; never blocks.
    pub fn ready(&mut self) -> Option<Option<DeviceStep>> {
        let front = self.pending.front()?;
        if let Some(last) = Self::last_event(front) {
            if !self.events[last].is_done().unwrap_or(true) {
                return None;
            }
        }
        let step = self.pending.pop_front()?;
        let times = if step.complete {
            self.device_times(&step)
        } else {
            None
        };
        if times.is_none() && step.host_end_ns > 0 {
            self.lost += 1;
        }
        // Free this step's events; its end stays taken as the next step's start.
        let freed = step.marks.len() + usize::from(step.start.is_some());
        self.in_use = self.in_use.saturating_sub(freed);
        let mut marks = step.marks;
        marks.clear();
        self.spare.push(marks);
        Some(times)
    }

    fn device_times(&self, step: &PendingStep) -> Option<DeviceStep> {
        let ns = |a: usize, b: usize| -> Option<u64> {
            let ms = self.events[a].ms_until(&self.events[b]).ok()?;
            Some((ms.max(0.0) * 1e6) as u64)
        };
        let (end, end_drained) = step.end?;
        let mut phase_ns = [0u64; N_PHASES];
        let mut idle_ns = 0;
        let first = step.marks.first()?;
        if let Some(start) = step.start {
            phase_ns[Phase::Other.index()] += ns(start, first.event)?;
        }
        for (i, m) in step.marks.iter().enumerate() {
            let (next, drained) = match step.marks.get(i + 1) {
                Some(n) => (n.event, n.drained),
                None => (end, end_drained),
            };
            let d = ns(m.event, next)?;
            phase_ns[m.phase.index()] += d;
            if drained || m.phase.is_wait() {
                idle_ns += d;
            }
        }
        Some(DeviceStep {
            host_end_ns: step.host_end_ns,
            phase_ns,
            idle_ns,
        })
    }
}

struct GpuSide {
    stream: Stream,
    timer: Option<EventTimer>,
    /// The mode the step in progress began in.
    step_mode: Option<GpuTiming>,
    /// Whether each step's CUDA calls take in those of threads that are no worker's on its
    /// context (a drafter's backward, run on libtorch's autograd thread; see cupti.rs).
    adopts_foreign_calls: bool,
}

/// A worker's phase recorder with the GPU timing modes applied.
pub struct Marks {
    pub rec: PhaseRecorder,
    switches: Arc<Switches>,
    gpu: Option<GpuSide>,
}

impl Marks {
    /// On a CUDA device: takes a stream from libtorch's pool and makes it this thread's current
    /// stream, so the worker's kernels run beside, not behind, another worker's on the same GPU.
    pub fn new(rec: PhaseRecorder, device: Device, switches: Arc<Switches>) -> Result<Marks> {
        let gpu = Stream::own(device)?.map(|stream| GpuSide {
            stream,
            timer: None,
            step_mode: None,
            adopts_foreign_calls: false,
        });
        if gpu.is_some() {
            crate::engine::gpu::cupti::claim_thread();
        }
        Ok(Marks { rec, switches, gpu })
    }

    /// Counts, in each step's CUDA calls, those libtorch's own threads make on this worker's
    /// device (the autograd engine runs a drafter's backward there while the drafter waits).
    pub fn adopt_autograd_calls(&mut self) {
        if let Some(g) = &mut self.gpu {
            g.adopts_foreign_calls = true;
        }
    }

    /// The worker's own stream, on a GPU.
    pub fn stream(&self) -> Option<&Stream> {
        self.gpu.as_ref().map(|g| &g.stream)
    }

    #[inline]
    pub fn mark(&mut self, phase: Phase) {
        crate::telemetry::phase::set_current(phase);
        if let Some(g) = &mut self.gpu {
            if self.switches.profiling() {
                let mode = self.switches.gpu_timing();
                if g.step_mode.is_none() {
                    g.step_mode = Some(mode);
                }
                match mode {
                    GpuTiming::Sync => {
                        let _ = g.stream.synchronize();
                    }
                    GpuTiming::Events if g.step_mode == Some(mode) => {
                        if g.timer.is_none() {
                            g.timer = EventTimer::new().ok();
                        }
                        if let Some(t) = &mut g.timer {
                            t.mark(phase, &g.stream);
                        }
                    }
                    _ => {}
                }
            }
        }
        self.rec.mark(phase);
    }

    /// Ends the iteration. In `events` mode the host record carries steps, tokens and metrics,
    /// and the device times of earlier steps whose events are done follow as their own records.
    pub fn end_step(&mut self, tokens: u64, metrics: Option<TrainMetrics>) {
        self.rec
            .add_host_syncs(&crate::engine::gpu::host_sync::take());
        let Some(g) = &mut self.gpu else {
            // A CPU worker's CUDA calls are not counted (it makes none).
            self.rec.end_step(tokens, metrics);
            return;
        };
        let mut calls = crate::engine::gpu::cupti::take();
        if let (Some(c), true) = (&mut calls, g.adopts_foreign_calls) {
            c.add(&crate::engine::gpu::cupti::adopt_foreign());
        }
        self.rec.set_cuda_calls(calls);
        let mode = self.switches.gpu_timing();
        let events = mode == GpuTiming::Events
            && g.step_mode == Some(GpuTiming::Events)
            && self.switches.profiling()
            && g.timer.is_some();
        let end_ns = self
            .rec
            .end_step_timed(tokens, metrics, Timing::of(mode), !events);
        if let Some(t) = &mut g.timer {
            if events {
                t.end_step(&g.stream, end_ns);
            } else {
                t.abandon_step();
            }
            while let Some(step) = t.ready() {
                if let Some(d) = step {
                    self.rec.send_device_step(
                        d.host_end_ns,
                        d.phase_ns,
                        d.idle_ns,
                        Timing::GpuEvents,
                    );
                }
            }
        }
        g.step_mode = None;
    }

    /// Blocks while training is paused; the paused time is not reported as a step.
    pub fn hold_while_paused(&mut self, cancel: &CancelToken) {
        if !self.switches.paused() {
            return;
        }
        while self.switches.paused() && !cancel.is_cancelled() {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Some(t) = self.gpu.as_mut().and_then(|g| g.timer.as_mut()) {
            t.abandon_step();
        }
        let _ = crate::engine::gpu::host_sync::take();
        let _ = crate::engine::gpu::cupti::take();
        if self.gpu.as_ref().is_some_and(|g| g.adopts_foreign_calls) {
            let _ = crate::engine::gpu::cupti::adopt_foreign();
        }
        self.rec.restart();
    }
}
