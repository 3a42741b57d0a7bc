//! The immutable picture the hub publishes ~10 times a second. Front-ends render only this.

use super::names::Names;
use super::phase::{Phase, Role};
use super::switches::GpuTiming;
use super::verdict::Verdict;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

mod phase_window;
pub use phase_window::PhaseWindow;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ThreadState {
    Working,
    Waiting,
    Exited,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadView {
    pub name: String,
    pub role: Role,
    pub device: String,
    pub tid: i32,
    pub cpu_pct: Option<f32>,
    pub phase: Phase,
    /// How long the thread has been in `phase`, seconds.
    #[serde(default)]
    pub phase_s: f64,
    pub state: ThreadState,
    /// The kernel's state letter from /proc (R running, S sleeping, D blocked in I/O, …).
    #[serde(default)]
    pub os_state: Option<char>,
    pub w1: PhaseWindow,
    pub w10: PhaseWindow,
    pub run: PhaseWindow,
    /// The sizes of its last steps, where its steps carry the pipeline's tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<StepSizes>,
}

/// The sizes (tokens) of a thread's last steps: how many steps, how many different sizes among
/// them, the least and the most. A batch's tokens are its shape's rows times its length, so
/// sizes that differ from step to step are shapes that do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSizes {
    pub steps: u32,
    pub distinct: u32,
    pub min: u64,
    pub max: u64,
}

/// Threads of the process that no worker registered (libtorch's pools, the UI, …), by name and
/// by the worker that drives them where that is known.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadGroupView {
    pub name: String,
    pub count: usize,
    pub cpu_pct: f32,
    /// The worker these threads work for (its intra-op pool, its autograd thread).
    #[serde(default)]
    pub owner: Option<String>,
    /// How many of them are in each kernel state, by state letter.
    #[serde(default)]
    pub states: Vec<(char, usize)>,
}

/// Memory of this process and of the host (sysinfo), MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryView {
    pub rss_mib: u64,
    pub host_used_mib: u64,
    pub host_total_mib: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    pub name: String,
    pub producers: String,
    pub consumers: String,
    pub capacity: usize,
    pub depth: usize,
    pub min_depth: usize,
    pub max_depth: usize,
    pub mean_depth: f64,
    pub empty_share: f64,
    pub full_share: f64,
    pub push_per_s: f64,
    pub pop_per_s: f64,
    pub mean_age_ms: f64,
    /// Share of the consumers' time spent waiting on an empty queue (1 s window).
    pub consumer_wait_share: f64,
    /// Share of the producers' time spent waiting on a full queue (1 s window).
    pub producer_wait_share: f64,
    /// Mean depth per tick, oldest first.
    pub history: Vec<f64>,
    pub starving: bool,
    pub blocking: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub name: String,
    pub util_pct: u32,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    pub power_w: f64,
    pub sm_clock_mhz: u32,
    pub temp_c: u32,
    pub util_history: Vec<u32>,
    /// This device is `cuda:N` in the process; None when CUDA_VISIBLE_DEVICES hides it.
    #[serde(default)]
    pub cuda: Option<u32>,
    /// Memory-bandwidth utilisation, percent.
    #[serde(default)]
    pub mem_bw_pct: u32,
    /// This process's memory on the device, MiB, when NVML lists it.
    #[serde(default)]
    pub proc_mem_mib: Option<u64>,
    /// Why the clocks are held down (`sw-power`, `hw-thermal`, `idle`, …).
    #[serde(default)]
    pub throttle: Vec<String>,
    /// The host the device is on, for a process watched on another host (its samples carry
    /// its GPUs); none for this host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// libtorch's caching allocator on one CUDA device of this process (`getDeviceStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AllocatorView {
    /// The device, `cuda:N`.
    pub cuda: u32,
    pub reserved_bytes: u64,
    pub allocated_bytes: u64,
    /// Segments held now.
    pub segments: u64,
    /// Device allocations (cudaMalloc or mapped), frees (cudaFree or unmapped) and allocation
    /// retries since the process started.
    pub device_allocs: u64,
    pub device_frees: u64,
    pub alloc_retries: u64,
    /// Device allocations plus frees a second, and retries a second, since the last sample.
    pub churn_per_s: f64,
    pub retries_per_s: f64,
    /// CUDA graph captures begun and ended on the device, in all (our engine's; their pools are
    /// device allocations the `alloc_churn` rule does not count as churn).
    #[serde(default)]
    pub graph_events: u64,
    /// The host of the device, for a process watched on another host; none for this host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum GpuPanel {
    Absent(String),
    Present(Vec<GpuView>),
}

impl Default for GpuPanel {
    fn default() -> Self {
        GpuPanel::Absent("no NVIDIA GPU (NVML not found)".into())
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainView {
    pub step: u64,
    pub loss: Option<f32>,
    pub tau: Option<f32>,
    pub lr: Option<f32>,
    pub grad_norm: Option<f32>,
    /// Drafter steps skipped for a non-finite loss or gradient, in all.
    #[serde(default)]
    pub skipped_nonfinite: u64,
    pub slot_acc: Vec<f32>,
    pub tokens_total: u64,
    pub tok_per_s_1s: f64,
    pub tok_per_s_10s: f64,
}

/// What the profiler itself costs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelfCost {
    pub marks_per_s: f64,
    pub ns_per_mark: f64,
    pub snapshot_us: f64,
    /// Step records the channel had no room for.
    pub dropped: u64,
    /// Step spans (for traces) beyond the cap between two snapshots.
    #[serde(default)]
    pub spans_dropped: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub seq: u64,
    pub elapsed_s: f64,
    /// The hub's clock when this snapshot was taken, on the same scale as `StepSpan::end_ns`
    /// (0 in recordings made before it was kept).
    #[serde(default)]
    pub now_ns: u64,
    pub train: TrainView,
    pub profiling: bool,
    /// The GPU timing mode; None when no worker drives a GPU (the modes mean nothing there).
    pub gpu_timing: Option<GpuTiming>,
    pub paused: bool,
    pub verdict: Verdict,
    /// What has not ended while the pipeline is stalled: "target-0 in forward for 12.0 s".
    #[serde(default)]
    pub stall: Option<String>,
    pub threads: Vec<ThreadView>,
    pub groups: Vec<ThreadGroupView>,
    pub cpu_note: Option<String>,
    #[serde(default)]
    pub memory: Option<MemoryView>,
    pub queues: Vec<QueueView>,
    pub gpus: GpuPanel,
    /// Why the CUDA threads' launches and syncs are not counted (`no libcupti`, `off`, …): the
    /// run's `--cupti` as resolved; None where CUPTI counts them or the producer never does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti: Option<String>,
    /// The caching allocator on each CUDA device this process trains on; empty on the CPU,
    /// without the CUDA shim, or when watching another process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocator: Vec<AllocatorView>,
    /// The drafter's cost per batch over the target's, estimated from the models' FLOPs (for the
    /// placement advice where the stages share GPUs and their times cannot be told apart).
    #[serde(default)]
    pub stage_ratio_flops: Option<f64>,
    /// (elapsed s, value), oldest first.
    pub loss_history: Vec<(f64, f64)>,
    pub tok_history: Vec<(f64, f64)>,
    pub self_cost: SelfCost,
    /// A line from the engine: a saved checkpoint, an error, "finished".
    pub status: Option<String>,
    /// Failures that stay shown while the run goes on (a `--record` that could not write).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<String>,
    /// The steps that ended since the previous snapshot (for traces); empty when not kept.
    #[serde(default)]
    pub steps: Vec<StepSpan>,
    /// The warnings in force, most severe first (raised by `telemetry::warnings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<super::warning::Warning>,
    /// A merged view of several sessions (`attach --job`, `attach A B`): each one's own numbers,
    /// in rank order; empty for one process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankView>,
    /// The names of the pipeline this snapshot shows (its declared stages and phases): what
    /// every front-end names its roles, phases and verdict with. Built-in by default (and then
    /// left out of a file).
    #[serde(default, skip_serializing_if = "builtin")]
    pub names: Arc<Names>,
    /// Host syncs by call site, each thread's costliest first, where the producer keeps them
    /// (zero-code mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sync_sites: Vec<SyncSite>,
}

/// Host syncs of one thread at one call site, since the thread started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncSite {
    pub thread: String,
    /// `train.py:42`, or `other` for the sites beyond those kept.
    pub at: String,
    /// `.item()`, `.cpu()`, `synchronize`, …
    pub op: String,
    pub count: u64,
    pub ns: u64,
    /// The steps the thread had ended when these were counted (0: not known).
    #[serde(default)]
    pub steps: u64,
}

impl SyncSite {
    /// `train.py:42 .item() x2.0 1.3ms`: the site, its op, its syncs and their time a step (the
    /// time left out where the producer does not time them).
    pub fn per_step(&self) -> String {
        let steps = self.steps.max(1) as f64;
        let mut out = format!("{} {} x{:.1}", self.at, self.op, self.count as f64 / steps);
        if self.ns > 0 {
            out.push_str(&format!(" {:.1}ms", self.ns as f64 / 1e6 / steps));
        }
        out.trim_start().replace("  ", " ")
    }
}

impl Snapshot {
    /// Thread `t`'s host syncs by call site, the costliest first: where the producer keeps
    /// them (zero-code mode), else, where it counts host syncs by phase (our engine), one row a
    /// phase (`phase metrics`, op `sync`, untimed).
    pub fn sites_of(&self, t: &ThreadView) -> Vec<SyncSite> {
        let mut out: Vec<SyncSite> = self
            .sync_sites
            .iter()
            .filter(|s| s.thread == t.name)
            .cloned()
            .collect();
        if out.is_empty() {
            for p in self.names.phases(t.role) {
                let n = t.run.host_syncs[p.index()];
                if n > 0 {
                    out.push(SyncSite {
                        thread: t.name.clone(),
                        at: format!("phase {}", self.names.phase(*p)),
                        op: "sync".into(),
                        count: n,
                        ns: 0,
                        steps: t.run.steps,
                    });
                }
            }
        }
        out.sort_by_key(|s| std::cmp::Reverse((s.ns, s.count)));
        out
    }
}

fn builtin(names: &Arc<Names>) -> bool {
    names.is_builtin()
}

/// One session of a merged view: what its own hub made of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankView {
    /// `r1` (a rank of a job) or `p1234` (a session with no job): its threads' and queues' prefix.
    pub name: String,
    pub step: u64,
    pub tok_per_s: f64,
    pub verdict: Verdict,
    /// Its session ended (the others go on).
    #[serde(default)]
    pub ended: bool,
    /// It has reported tokens (a pipeline that never does has no tok/s to compare).
    #[serde(default)]
    pub counts_tokens: bool,
}

/// One ended iteration of one thread, for the Chrome trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSpan {
    /// Index into `Snapshot::threads` order is not stable; the thread's name is.
    pub thread: String,
    pub role: Role,
    pub end_ns: u64,
    pub wall_ns: u64,
    /// Non-zero phases, in the order the role marks them.
    pub phases: Vec<(Phase, u64)>,
}

impl Snapshot {
    /// Thread `t`'s CUDA calls per counted step in its window `w`: launches, ms in launch calls,
    /// ms in sync calls. Err: why there are none — `cpu` (the thread drives no GPU), the run's
    /// reason (`no libcupti`, `off`, …), `no steps` yet, or `not counted` (a producer that does
    /// not count them).
    pub fn cuda_calls<'a>(
        &'a self,
        t: &ThreadView,
        w: &PhaseWindow,
    ) -> Result<(f64, f64, f64), &'a str> {
        if let Some(per_step) = w.cuda_calls_per_step() {
            return Ok(per_step);
        }
        if !t.device.starts_with("cuda") {
            return Err("cpu");
        }
        if let Some(why) = &self.cupti {
            return Err(why);
        }
        Err(if w.steps == 0 {
            "no steps"
        } else {
            "not counted"
        })
    }

    /// Of a merged view's sessions still running, the one with the fewest tokens a second (None
    /// with fewer than two).
    pub fn slowest_rank(&self) -> Option<&RankView> {
        let live: Vec<&RankView> = self
            .ranks
            .iter()
            .filter(|r| !r.ended && r.counts_tokens)
            .collect();
        if live.len() < 2 {
            return None;
        }
        live.into_iter()
            .min_by(|a, b| a.tok_per_s.total_cmp(&b.tok_per_s))
    }

    /// Of a merged view's sessions still running (all, once every one ended), the one whose
    /// verdict is worst (`Verdict::severity`), the slower on a tie.
    pub fn worst_rank(&self) -> Option<&RankView> {
        let live = self.ranks.iter().filter(|r| !r.ended);
        let pool: Vec<&RankView> = if live.clone().next().is_some() {
            live.collect()
        } else {
            self.ranks.iter().collect()
        };
        pool.into_iter().max_by(|a, b| {
            a.verdict
                .severity()
                .cmp(&b.verdict.severity())
                .then(b.tok_per_s.total_cmp(&a.tok_per_s))
        })
    }

    pub fn queue(&self, name: &str) -> Option<&QueueView> {
        self.queues.iter().find(|q| q.name == name)
    }

    /// The caching allocator's figures of `cuda:N` (on `host`, none for this one), where they
    /// are read.
    pub fn allocator_of(&self, host: Option<&str>, cuda: u32) -> Option<&AllocatorView> {
        self.allocator
            .iter()
            .find(|a| a.cuda == cuda && a.host.as_deref() == host)
    }
}
