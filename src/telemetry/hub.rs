//! The hub: the one place where numbers meet. It drains step records, closes a tick every 100 ms,
//! reads queues, CPU and GPUs at their own rates, and publishes an immutable `Snapshot` to every
//! subscribed front-end (that thread: src/telemetry/hub/run.rs; here what the engine and the
//! front-ends share with it).

use super::assemble::TickInput;
use super::clock;
use super::names::Names;
use super::phase_recorder::{RecordSink, Registry, StepRecord};
use super::queue::QueueProbe;
use super::snapshot::{AllocatorView, Snapshot, SyncSite};
use super::switches::GpuTiming;
use super::switches::Switches;
use super::warnings::WarnConfig;
use crate::cancel::CancelToken;
use crate::probe::gpu::GpuSample;
use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

mod run;

/// One GPU reading of a host: its name and its GPUs.
pub type HostGpus = (String, Vec<GpuSample>);

/// Capacity of the step-record channel; beyond it records are dropped and counted.
pub const RECORD_CHANNEL: usize = 4096;
/// Snapshots a front-end may fall behind by (1.6 s at 10 a second) before it misses one.
pub const SUBSCRIBER_BACKLOG: usize = 16;

/// The one control path: every front-end (and the engine's own notes) sends these to the hub,
/// which applies them — switches for the workers, window resets, requests the engine polls.
/// An attached viewer's hub forwards the engine's part of them to the watched process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", content = "value", rename_all = "snake_case")]
pub enum HubCommand {
    SetProfiling(bool),
    SetGpuTiming(GpuTiming),
    SetPaused(bool),
    ResetWindows,
    /// Ask the engine to save a checkpoint after its current step.
    Checkpoint,
    /// A line to show in the header (checkpoint saved, run finished, …).
    Status(String),
}

/// Something that wants the hub's raw input as it goes by (the socket server, the recorder):
/// every record it ingests, and at each tick the queue counters it read and the switches.
/// Called on the hub thread: an implementation must not block.
pub trait RawTap: Send + Sync {
    fn record(&self, r: &StepRecord);
    fn tick(&self, input: &TickInput);
    /// A status line (checkpoint saved, run finished).
    fn status(&self, _text: &str) {}
}

/// Requests the hub passes on to the engine, which polls them between steps.
#[derive(Debug, Default)]
pub struct Requests {
    pub checkpoint_now: AtomicBool,
}

/// Everything the engine and front-ends share with the hub.
#[derive(Clone)]
pub struct Telemetry {
    sink: RecordSink,
    rx: Receiver<StepRecord>,
    queues: Arc<Mutex<Vec<QueueProbe>>>,
    subscribers: Arc<Mutex<Vec<Sender<Arc<Snapshot>>>>>,
    /// The last snapshot published (a subscriber that fell behind may have missed it).
    last: Arc<Mutex<Option<Arc<Snapshot>>>>,
    commands: (Sender<HubCommand>, Receiver<HubCommand>),
    requests: Arc<Requests>,
    /// Whether the hub samples /proc and NVML (off in tests that script everything).
    pub probes: bool,
    /// The process whose threads the CPU probe reads: None for this one, else the watched one.
    pub watched_pid: Option<u32>,
    /// A phase mark's cost measured by the watched process (else measured here at hub start).
    pub ns_per_mark: Option<f64>,
    /// How long a verdict change must hold before it is shown (`verdict_dwell` in the TOML).
    pub verdict_dwell_ns: u64,
    taps: Arc<Mutex<Vec<Arc<dyn RawTap>>>>,
    /// Where engine commands go when the engine is in another process (an attached viewer).
    forward: Arc<Mutex<Option<Sender<HubCommand>>>>,
    /// Failures that stay on screen for the rest of the run (a recording that stopped).
    alerts: Arc<Mutex<Vec<String>>>,
    /// The caching allocator's views of a watched process, as its samples bring them (this
    /// process's own are read by the hub).
    remote_allocator: Arc<Mutex<Vec<AllocatorView>>>,
    /// A watched process's host syncs by call site, as its samples bring them.
    remote_sites: Arc<Mutex<Vec<SyncSite>>>,
    /// The latest GPU reading a watched process on another host sent, with its host's name;
    /// taken by the hub (this host's NVML cannot read those devices).
    remote_gpus: Arc<Mutex<Option<HostGpus>>>,
    /// The warning rules' settings (`[warnings]` in the run's TOML; defaults elsewhere).
    pub warnings: WarnConfig,
    /// The names of the pipeline whose threads the registry holds (a watched process's declared
    /// stages; ours by default): its snapshots carry them.
    names: Arc<Mutex<Arc<Names>>>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        Self::with_capacity(RECORD_CHANNEL)
    }

    pub fn with_capacity(records: usize) -> Self {
        clock::init();
        let (tx, rx) = bounded(records);
        Telemetry {
            sink: RecordSink {
                tx,
                dropped: Arc::new(AtomicU64::new(0)),
                switches: Arc::new(Switches::default()),
                registry: Arc::new(Registry::default()),
            },
            rx,
            queues: Arc::default(),
            subscribers: Arc::default(),
            last: Arc::default(),
            commands: unbounded(),
            requests: Arc::default(),
            probes: true,
            watched_pid: None,
            ns_per_mark: None,
            verdict_dwell_ns: super::verdict::DWELL_NS,
            taps: Arc::default(),
            forward: Arc::default(),
            alerts: Arc::default(),
            remote_allocator: Arc::default(),
            remote_sites: Arc::default(),
            remote_gpus: Arc::default(),
            warnings: WarnConfig::default(),
            names: Arc::default(),
        }
    }

    /// The names of the pipeline watched (see `set_names`).
    pub fn names(&self) -> Arc<Names> {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Names the pipeline watched: a mirror sets its producer's declared stages and phases
    /// before it registers their threads.
    pub fn set_names(&self, names: Arc<Names>) {
        *self.names.lock().unwrap_or_else(|e| e.into_inner()) = names;
    }

    /// Adds a tap on the hub's raw input (see `RawTap`).
    pub fn add_tap(&self, tap: Arc<dyn RawTap>) {
        self.taps.lock().expect("taps poisoned").push(tap);
    }

    fn taps(&self) -> Vec<Arc<dyn RawTap>> {
        self.taps.lock().expect("taps poisoned").clone()
    }

    /// Sends the engine's commands (switches, checkpoint) to `to` instead of applying them here:
    /// the engine is another process, and its switches come back in its samples.
    pub fn forward_commands(&self, to: Sender<HubCommand>) {
        *self.forward.lock().expect("forward poisoned") = Some(to);
    }

    pub fn sink(&self) -> &RecordSink {
        &self.sink
    }

    pub fn switches(&self) -> &Arc<Switches> {
        &self.sink.switches
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.sink.registry
    }

    pub fn dropped(&self) -> u64 {
        self.sink.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets the dropped count shown (a viewer: what the watched process and the socket lost).
    pub fn set_dropped(&self, n: u64) {
        self.sink.dropped.store(n, Ordering::Relaxed);
    }

    pub fn records(&self) -> &Receiver<StepRecord> {
        &self.rx
    }

    pub fn add_queue(&self, probe: QueueProbe) {
        self.queues.lock().expect("queue list poisoned").push(probe);
    }

    pub fn queue_probes(&self) -> Vec<QueueProbe> {
        self.queues.lock().expect("queue list poisoned").clone()
    }

    /// A new front-end's feed of snapshots. A slow front-end misses snapshots, never blocks.
    pub fn subscribe(&self) -> Receiver<Arc<Snapshot>> {
        self.subscribe_with(SUBSCRIBER_BACKLOG)
    }

    /// A feed that holds up to `backlog` snapshots before it misses any (the recorder, which must
    /// keep every one, asks for a long one).
    pub fn subscribe_with(&self, backlog: usize) -> Receiver<Arc<Snapshot>> {
        let (tx, rx) = bounded(backlog.max(1));
        self.subscribers
            .lock()
            .expect("subscribers poisoned")
            .push(tx);
        rx
    }

    pub fn command(&self, c: HubCommand) {
        let _ = self.commands.0.send(c);
    }

    /// Raises an alert: a failure every later snapshot carries (the header and the headless
    /// lines show it) while the run goes on; attached viewers get it as a status line.
    pub fn alert(&self, text: String) {
        let mut alerts = self.alerts.lock().unwrap_or_else(|e| e.into_inner());
        if !alerts.contains(&text) {
            alerts.push(text.clone());
            drop(alerts);
            self.command(HubCommand::Status(text));
        }
    }

    /// The alerts raised so far, oldest first.
    pub fn alerts(&self) -> Vec<String> {
        self.alerts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets the caching allocator's views of the watched process (a mirror, at each of its
    /// samples); later snapshots carry them where the hub reads no allocator of its own.
    pub fn set_remote_allocator(&self, views: Vec<AllocatorView>) {
        *self
            .remote_allocator
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = views;
    }

    /// Hands the hub a GPU reading of the watched process's host, `host` (a mirror of a
    /// session on another host, at each sample that carries one).
    pub fn set_remote_gpus(&self, host: String, gpus: Vec<GpuSample>) {
        *self.remote_gpus.lock().unwrap_or_else(|e| e.into_inner()) = Some((host, gpus));
    }

    /// The GPU reading `set_remote_gpus` handed over, once (the hub takes it; so does a replay).
    pub fn take_remote_gpus(&self) -> Option<HostGpus> {
        self.remote_gpus
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Sets the watched process's host syncs by call site (a mirror, when its samples bring
    /// them); later snapshots carry them.
    pub fn set_sync_sites(&self, sites: Vec<SyncSite>) {
        *self.remote_sites.lock().unwrap_or_else(|e| e.into_inner()) = sites;
    }

    /// The watched process's host syncs by call site, as last set.
    pub fn sync_sites(&self) -> Vec<SyncSite> {
        self.remote_sites
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The watched process's allocator views, as last set.
    pub fn remote_allocator(&self) -> Vec<AllocatorView> {
        self.remote_allocator
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What the engine is asked to do (set by the hub from commands).
    pub fn requests(&self) -> &Arc<Requests> {
        &self.requests
    }

    /// Applies a command that does not need the hub's windows; returns the others.
    pub fn apply(&self, c: HubCommand) -> Option<HubCommand> {
        if let Some(to) = self.forward.lock().expect("forward poisoned").as_ref() {
            return match c {
                HubCommand::ResetWindows | HubCommand::Status(_) => Some(c),
                engine => {
                    let _ = to.send(engine);
                    None
                }
            };
        }
        let sw = self.switches();
        match c {
            HubCommand::SetProfiling(on) => sw.set_profiling(on),
            HubCommand::SetGpuTiming(m) => sw.set_gpu_timing(m),
            HubCommand::SetPaused(p) => sw.set_paused(p),
            HubCommand::Checkpoint => self.requests.checkpoint_now.store(true, Ordering::SeqCst),
            other => return Some(other),
        }
        None
    }

    /// Starts the hub thread; it stops when `cancel` is set and publishes a last snapshot.
    pub fn spawn_hub(&self, cancel: CancelToken) -> std::io::Result<JoinHandle<()>> {
        let t = self.clone();
        std::thread::Builder::new()
            .name("hub".into())
            .spawn(move || t.run_hub(cancel))
    }

    /// Takes the commands waiting now, unapplied (a hub run by hand: a replay's simulation).
    pub fn take_commands(&self) -> Vec<HubCommand> {
        self.commands.1.try_iter().collect()
    }

    /// Applies what is waiting on the command channel now (when no hub thread runs).
    pub fn apply_pending(&self) {
        while let Ok(c) = self.commands.1.try_recv() {
            self.apply(c);
        }
    }

    /// Sends `snap` to every subscriber, as the hub does each tick (a merged view of several
    /// sessions publishes what it made of theirs).
    pub fn publish(&self, snap: Snapshot) {
        let snap = Arc::new(snap);
        let mut subs = self.subscribers.lock().expect("subscribers poisoned");
        subs.retain(|s| !matches!(s.try_send(snap.clone()), Err(TrySendError::Disconnected(_))));
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(snap);
    }

    /// The last snapshot published: after a run stopped, the step it ended (and saved) at, which
    /// a front-end's feed, full while nobody read it, may not hold.
    pub fn last_snapshot(&self) -> Option<Arc<Snapshot>> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What one phase mark costs on this machine, measured once at hub start (about a millisecond),
/// for the self-cost line.
pub fn measure_mark_cost() -> f64 {
    use super::phase::{Phase, Role};
    let t = Telemetry::with_capacity(1);
    let mut rec = t.sink().recorder(Role::Hub, "cpu");
    let n = 20_000;
    let start = std::time::Instant::now();
    for i in 0..n {
        rec.mark(if i % 2 == 0 {
            Phase::Forward
        } else {
            Phase::Backward
        });
    }
    start.elapsed().as_nanos() as f64 / n as f64
}
