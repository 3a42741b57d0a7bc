//! The producer's side of the stream: a hub tap that turns raw input (records, queue counters,
//! live steps, switches) into frames, encoded once, and hands them to every outlet (a socket
//! viewer, a recording file) without ever blocking the hub: an outlet that is full loses the
//! frame, and counts it. Declarations (hello, threads, queues) and status lines always arrive:
//! they go on an unbounded side channel, and a new outlet gets all of them first.

use super::protocol::*;
use crate::telemetry::assemble::TickInput;
use crate::telemetry::clock;
use crate::telemetry::hub::RawTap;
use crate::telemetry::names::Names;
use crate::telemetry::phase_recorder::{StepRecord, ThreadInfo};
use crate::telemetry::queue::{QueueCounters, QueueProbe};
use crate::telemetry::stages::StageTable;
use crate::telemetry::{Phase, Role, Telemetry};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

pub type Frame = Arc<[u8]>;

/// One receiver of the stream. Its writer drains `ctl` before `data`.
pub struct Outlet {
    data: Sender<Frame>,
    ctl: Sender<Frame>,
    /// Takes one sample in this many (a recording keeps every step but fewer samples).
    sample_every: u64,
    samples: AtomicU64,
    /// Data frames this outlet had no room for.
    pub dropped: AtomicU64,
    pub closed: AtomicBool,
}

/// The writer's ends of an outlet.
pub struct OutletRx {
    pub data: Receiver<Frame>,
    pub ctl: Receiver<Frame>,
}

impl Outlet {
    /// An outlet that holds up to `backlog` data frames before it loses any.
    pub fn new(backlog: usize) -> (Arc<Outlet>, OutletRx) {
        Self::thinned(backlog, 1)
    }

    /// An outlet that takes only one sample in `sample_every` (all steps and declarations).
    pub fn thinned(backlog: usize, sample_every: u64) -> (Arc<Outlet>, OutletRx) {
        let (data, data_rx) = bounded(backlog.max(1));
        let (ctl, ctl_rx) = unbounded();
        (
            Arc::new(Outlet {
                data,
                ctl,
                sample_every: sample_every.max(1),
                samples: AtomicU64::new(0),
                dropped: AtomicU64::new(0),
                closed: AtomicBool::new(false),
            }),
            OutletRx {
                data: data_rx,
                ctl: ctl_rx,
            },
        )
    }

    fn send_data(&self, f: &Frame) {
        if let Err(TrySendError::Full(_)) = self.data.try_send(f.clone()) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// A sample, if this outlet takes it: one in `sample_every`, and every one that carries a
    /// GPU reading (once a second; a thinned recording would otherwise keep them by chance).
    fn send_sample(&self, f: &Frame, has_gpus: bool) {
        let nth = self.samples.fetch_add(1, Relaxed);
        if has_gpus || nth.is_multiple_of(self.sample_every) {
            self.send_data(f);
        }
    }

    fn send_ctl(&self, f: &Frame) {
        let _ = self.ctl.send(f.clone());
    }

    /// A status line for this outlet's reader alone (a refused request).
    pub fn send_status(&self, text: &str) {
        self.send_ctl(&encode(&Msg::Status { text: text.into() }).into());
    }
}

#[derive(Default)]
struct State {
    /// Hello, then every declaration so far, in order: what a new outlet is sent first.
    decls: Vec<Frame>,
    /// Stage of each declared thread (for its phases' indices).
    roles: Vec<Role>,
    queues: usize,
    outlets: Vec<Arc<Outlet>>,
}

/// The tap. Cheap when no outlet is attached: records are encoded only for someone.
pub struct Fanout {
    telemetry: Telemetry,
    /// The names of the table the hello declares (our pipeline's): a phase goes on the wire as
    /// its index in its role's list there.
    names: Names,
    /// The job the hello names (the stats file beside the socket says it too).
    job: Option<crate::job::JobTag>,
    state: Mutex<State>,
}

/// A phase's index in a role's list (`other` is the list's last entry).
fn phase_index(names: &Names, role: Role, p: Phase) -> Option<u16> {
    names
        .phases(role)
        .iter()
        .position(|x| *x == p)
        .map(|i| i as u16)
}

/// Non-zero phases as (index in the role's list, ns), `other` left out (the rest of the wall).
fn sparse(names: &Names, role: Role, ns: &[u64]) -> Vec<(u16, u64)> {
    names
        .phases(role)
        .iter()
        .filter(|p| **p != Phase::Other)
        .filter_map(|p| {
            let v = ns[p.index()];
            (v > 0).then(|| (phase_index(names, role, *p).unwrap_or(0), v))
        })
        .collect()
}

/// Non-zero counts by index in `role`'s list (`other` included: a count outside any phase).
fn sparse_counts(names: &Names, role: Role, n: &[u32]) -> Vec<(u16, u32)> {
    names
        .phases(role)
        .iter()
        .filter_map(|p| {
            let v = n[p.index()];
            (v > 0).then(|| (phase_index(names, role, *p).unwrap_or(0), v))
        })
        .collect()
}

impl Fanout {
    /// A fan-out of `telemetry`'s raw input, added as a tap of its hub (start the hub after);
    /// `can_save`: whether the engine can save a checkpoint when a viewer asks; `config`: the
    /// run's `config:` line, said in the hello.
    pub fn tap(telemetry: &Telemetry, can_save: bool, config: Option<String>) -> Arc<Fanout> {
        Self::tap_job(telemetry, can_save, config, None)
    }

    /// `tap` for one rank of a multi-process job: the hello names `job`.
    pub fn tap_job(
        telemetry: &Telemetry,
        can_save: bool,
        config: Option<String>,
        job: Option<crate::job::JobTag>,
    ) -> Arc<Fanout> {
        let f = Fanout::with_job(
            telemetry,
            crate::telemetry::hub::measure_mark_cost(),
            can_save,
            config,
            job,
        );
        telemetry.add_tap(f.clone());
        f
    }

    pub fn new(
        telemetry: &Telemetry,
        ns_per_mark: f64,
        can_save: bool,
        config: Option<String>,
    ) -> Arc<Fanout> {
        Self::with_job(telemetry, ns_per_mark, can_save, config, None)
    }

    fn with_job(
        telemetry: &Telemetry,
        ns_per_mark: f64,
        can_save: bool,
        config: Option<String>,
        job: Option<crate::job::JobTag>,
    ) -> Arc<Fanout> {
        let stages = StageTable::builtin();
        let (names, _) = stages.resolve().expect("the built-in table resolves");
        let hello = Msg::Hello(Hello {
            pid: std::process::id(),
            program: "dflash-top".into(),
            now_ns: clock::to_monotonic(clock::now_ns()),
            ns_per_mark,
            stages,
            can_save,
            config,
            job: job.clone(),
            cupti: telemetry.switches().cupti(),
            host: Some(crate::fault::host_name().unwrap_or_else(crate::job::hostname)),
        });
        Arc::new(Fanout {
            telemetry: telemetry.clone(),
            names,
            job,
            state: Mutex::new(State {
                decls: vec![encode(&hello).into()],
                ..State::default()
            }),
        })
    }

    /// The job the hello names.
    pub fn job(&self) -> Option<&crate::job::JobTag> {
        self.job.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an outlet; it gets every declaration so far before anything else.
    pub fn attach(&self, outlet: Arc<Outlet>) {
        let mut st = self.lock();
        for d in &st.decls {
            outlet.send_ctl(d);
        }
        st.outlets.push(outlet);
    }

    /// Whether anyone listens (closed outlets are let go here).
    fn live_outlets(st: &mut State) -> bool {
        st.outlets.retain(|o| !o.closed.load(Relaxed));
        !st.outlets.is_empty()
    }

    fn declare(st: &mut State, m: &Msg) {
        let f: Frame = encode(m).into();
        for o in &st.outlets {
            o.send_ctl(&f);
        }
        st.decls.push(f);
    }

    fn declare_threads(&self, st: &mut State, threads: &[ThreadInfo]) {
        for (i, t) in threads.iter().enumerate().skip(st.roles.len()) {
            st.roles.push(t.role);
            Self::declare(
                st,
                &Msg::Thread(ThreadDecl {
                    id: i as u32,
                    name: t.name.clone(),
                    stage: self.names.role(t.role).to_string(),
                    device: t.device.clone(),
                    tid: t.tid,
                }),
            );
        }
    }

    fn declare_queues(st: &mut State, queues: &[QueueProbe]) {
        for (i, q) in queues.iter().enumerate().skip(st.queues) {
            st.queues += 1;
            Self::declare(
                st,
                &Msg::Queue(QueueDecl {
                    id: i as u32,
                    name: q.name().to_string(),
                    capacity: q.capacity(),
                    producer: q.producers().to_string(),
                    consumer: q.consumers().to_string(),
                }),
            );
        }
    }

    fn broadcast(st: &State, m: &Msg) {
        let f: Frame = encode(m).into();
        let sample = match m {
            Msg::Sample(s) => Some(!s.gpu.is_empty()),
            _ => None,
        };
        for o in &st.outlets {
            if let Some(has_gpus) = sample {
                o.send_sample(&f, has_gpus);
            } else {
                o.send_data(&f);
            }
        }
    }
}

fn queue_sample(id: usize, c: &QueueCounters) -> WireQueue {
    WireQueue {
        id: id as u32,
        at: clock::to_monotonic(c.at_ns),
        depth: c.depth,
        push: c.pushes,
        pop: c.pops,
        push_wait: c.push_wait_ns,
        pop_wait: c.pop_wait_ns,
        depth_ns: c.depth_ns.min(u64::MAX as u128) as u64,
        empty: c.empty_ns,
        full: c.full_ns,
        age_sum: c.age_ns_sum,
        min: c.min_depth,
        max: c.max_depth,
    }
}

impl RawTap for Fanout {
    fn record(&self, r: &StepRecord) {
        let mut st = self.lock();
        if !Self::live_outlets(&mut st) {
            return;
        }
        if r.thread >= st.roles.len() {
            self.declare_threads(&mut st, &self.telemetry.registry().threads());
        }
        let Some(&role) = st.roles.get(r.thread) else {
            return;
        };
        let m = Msg::Step(WireStep {
            th: r.thread as u32,
            end: clock::to_monotonic(r.end_ns),
            wall: r.wall_ns,
            ph: sparse(&self.names, role, &r.phase_ns),
            prof: r.profiled,
            timing: r.timing,
            steps: r.steps,
            idle: r.gpu_idle_ns,
            tok: r.tokens,
            m: r.metrics,
            n: Vec::new(),
            sy: sparse_counts(&self.names, role, &r.host_syncs),
            cu: r.cuda_calls,
        });
        Self::broadcast(&st, &m);
    }

    fn tick(&self, input: &TickInput) {
        let (threads, switches) = (input.threads, input.switches);
        let mut st = self.lock();
        self.declare_threads(&mut st, threads);
        Self::declare_queues(&mut st, input.queues);
        if !Self::live_outlets(&mut st) {
            return;
        }
        let live = threads
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let l = t.live.read();
                let len = self.names.phases(t.role).len() as u16 - 1;
                WireLive {
                    th: i as u32,
                    ph: phase_index(&self.names, t.role, l.phase).unwrap_or(len),
                    ps: clock::to_monotonic(l.phase_start_ns),
                    ss: clock::to_monotonic(l.step_start_ns),
                    acc: sparse(&self.names, t.role, &l.acc_ns),
                    sites: Vec::new(),
                    steps: 0,
                }
            })
            .collect();
        let m = Msg::Sample(Sample {
            now: clock::to_monotonic(input.now_ns),
            prof: switches.profiling(),
            timing: switches.gpu_timing(),
            paused: switches.paused(),
            dropped: input.dropped,
            live,
            q: input
                .counters
                .iter()
                .enumerate()
                .map(|(i, c)| queue_sample(i, c))
                .collect(),
            alloc: input.allocator.iter().map(WireAlloc::from).collect(),
            gpu: input.gpus.iter().map(WireGpu::from).collect(),
        });
        Self::broadcast(&st, &m);
    }

    fn status(&self, text: &str) {
        let st = self.lock();
        let f: Frame = encode(&Msg::Status { text: text.into() }).into();
        for o in &st.outlets {
            o.send_ctl(&f);
        }
    }
}

/// Writes an outlet's frames to `w` until the outlet closes or a write fails; between frames,
/// tells the reader how many data frames it lost so far.
pub fn pump(outlet: &Outlet, rx: &OutletRx, w: &mut impl std::io::Write) -> std::io::Result<()> {
    use crossbeam_channel::select;
    let mut told = 0;
    while !outlet.closed.load(Relaxed) {
        let frame = match rx.ctl.try_recv() {
            Ok(f) => Some(f),
            Err(_) => select! {
                recv(rx.ctl) -> f => f.ok(),
                recv(rx.data) -> f => f.ok(),
                default(std::time::Duration::from_millis(100)) => None,
            },
        };
        match frame {
            Some(f) => w.write_all(&f)?,
            None => w.flush()?,
        }
        let lost = outlet.dropped.load(Relaxed);
        if lost != told {
            write_msg(w, &Msg::Dropped { frames: lost })?;
            told = lost;
        }
    }
    w.flush()
}

/// Writes what is still queued (a recording being closed), control frames first.
pub fn drain(rx: &OutletRx, w: &mut impl std::io::Write) -> std::io::Result<()> {
    while let Ok(f) = rx.ctl.try_recv() {
        w.write_all(&f)?;
    }
    while let Ok(f) = rx.data.try_recv() {
        w.write_all(&f)?;
    }
    w.flush()
}
