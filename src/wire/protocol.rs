//! The wire protocol (docs/protocol.md): a 12-byte preamble each way (magic, version), then
//! frames of a 4-byte little-endian length and that many bytes of one JSON message. Timestamps
//! are CLOCK_MONOTONIC nanoseconds, which every process on the host shares. Here: the bounds and
//! the messages; `protocol/frame.rs` writes and reads the preamble and the frames,
//! `protocol/bounds.rs` checks a message against the bounds.

use crate::cuda_shim::AllocatorStats;
use crate::probe::allocator::AllocatorSample;
use crate::probe::gpu::GpuSample;
use crate::telemetry::stages::StageTable;
use crate::telemetry::switches::{GpuTiming, Timing};
use crate::telemetry::{CudaCalls, HubCommand, TrainMetrics};
use serde::{Deserialize, Serialize};

mod bounds;
mod frame;
pub use frame::{
    encode, read_msg, read_preamble, write_msg, write_preamble, write_preamble_version, WireError,
};

pub const MAGIC: [u8; 8] = *b"DFLSHTOP";
pub const VERSION: u32 = 1;
/// The largest frame either side accepts; anything longer is a broken or hostile peer.
pub const MAX_FRAME: usize = 1 << 20;

/// What a frame may declare (a recording is read back, or a producer is watched): ids index
/// tables and counts size them, so each is bounded before anything is allocated for it.
pub const MAX_THREADS: u32 = 1024;
pub const MAX_QUEUES: u32 = 256;
/// A CLOCK_MONOTONIC timestamp, ns (146 years of uptime).
pub const MAX_TIME_NS: u64 = 1 << 62;
/// One duration (a step, a phase, a wait), ns (52 days).
pub const MAX_SPAN_NS: u64 = 1 << 52;
/// Entries of a step's or a live step's phase list.
pub const MAX_PHASE_ENTRIES: usize = 64;
/// A cumulative counter (items pushed, ns waited over the run, tokens).
pub const MAX_COUNT: u64 = 1 << 62;
/// A name, a device, a status line, a reason, bytes.
pub const MAX_TEXT: usize = 4096;
/// A queue's capacity or depth.
pub const MAX_DEPTH: usize = 1 << 32;
/// CUDA devices a sample's allocator list may name (`cuda:0` to `cuda:63`).
pub const MAX_CUDA_DEVICES: u32 = 64;
/// GPUs a sample may list (a host's, as NVML sees them).
pub const MAX_GPUS: usize = 64;

/// What the producer says first: who it is and what its stages are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub pid: u32,
    /// `dflash-top` or `python`.
    pub program: String,
    pub now_ns: u64,
    /// What one phase mark costs in that process, ns.
    pub ns_per_mark: f64,
    pub stages: StageTable,
    /// Whether a `checkpoint` command can save (a trainer with --save-dir, a Python pipeline
    /// with a checkpoint handler).
    #[serde(default)]
    pub can_save: bool,
    /// The run's `config:` line (dflash-top's trainer: recipe, data, fast paths), kept in
    /// recordings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// The multi-process job this process is one rank of (src/job.rs); none for a plain run.
    /// `attach --job` finds the ranks by it and the merged view names threads by its rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::job::JobTag>,
    /// Why the producer's CUDA threads carry no launch counts (`off`, `libcupti not found`, …);
    /// none where they do, or where the producer never counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cupti: Option<String>,
    /// The producer's host name: a viewer on another host (a socket forwarded with `ssh -L`)
    /// shows the GPUs its samples carry under it. None from a producer that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// A thread of the producer, declared before any of its steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ThreadDecl {
    pub id: u32,
    pub name: String,
    /// A stage name of the table.
    pub stage: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The OS thread id (a task of /proc/PID/task).
    pub tid: i32,
}

/// A queue between two stages, declared before it is sampled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueueDecl {
    pub id: u32,
    pub name: String,
    pub capacity: usize,
    pub producer: String,
    pub consumer: String,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_host(t: &Timing) -> bool {
    *t == Timing::Host
}

/// One iteration of one thread. Phases by their index in the thread's stage's phase list; what
/// they do not cover of `wall` is `other`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireStep {
    pub th: u32,
    pub end: u64,
    pub wall: u64,
    #[serde(default)]
    pub ph: Vec<(u16, u64)>,
    /// Whether `ph` holds the whole iteration's phases.
    #[serde(default)]
    pub prof: bool,
    #[serde(default, skip_serializing_if = "is_host")]
    pub timing: Timing,
    /// Iterations ended: 1, or 0 for device times of an earlier one.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub steps: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub idle: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tok: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub m: Option<TrainMetrics>,
    /// Times a phase was entered in the iteration, by index in the stage's list, for the
    /// phases a producer counts (zero-code mode's host syncs); none when it counts nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub n: Vec<(u16, u32)>,
    /// Host syncs (reads of the device back to the host) in the iteration, by index in the
    /// stage's list, where the producer counts them (our engine); none otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sy: Vec<(u16, u32)>,
    /// The iteration's CUDA kernel launches and ns in launch and sync calls, where CUPTI
    /// counted them on the thread (our engine with `--cupti`); none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cu: Option<CudaCalls>,
}

/// The step a thread is in now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireLive {
    pub th: u32,
    /// Current phase (index in the stage's list; the list's length means `other`).
    pub ph: u16,
    /// When the current phase and the current step began.
    pub ps: u64,
    pub ss: u64,
    /// Time in each phase of the step before the current phase began.
    #[serde(default)]
    pub acc: Vec<(u16, u64)>,
    /// The thread's host syncs by call site since it started, `[site, op, count, ns]` (the
    /// costliest first; zero-code mode, about once a second); none otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<(String, String, u64, u64)>,
    /// With `sites`: the steps the thread ended since it started (the sites' per-step figures).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub steps: u64,
}

/// Call sites a live step may list (a producer sends its costliest 32 and one `other`).
pub const MAX_SITES: usize = 64;

/// A queue's cumulative counters (waits in progress included up to `at`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WireQueue {
    pub id: u32,
    pub at: u64,
    pub depth: usize,
    pub push: u64,
    pub pop: u64,
    pub push_wait: u64,
    pub pop_wait: u64,
    /// Integral of depth over time, depth x ns.
    pub depth_ns: u64,
    pub empty: u64,
    pub full: u64,
    pub age_sum: u64,
    /// Depth range since the previous sample.
    pub min: usize,
    pub max: usize,
}

/// The caching allocator on one CUDA device of the producer, as it reads it (libtorch's
/// `getDeviceStats`, Python's `torch.cuda.memory_stats`): what it holds now, and its counts
/// since the process started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WireAlloc {
    /// The device, `cuda:N` in the producer.
    pub cuda: u32,
    /// Bytes reserved from the device, and in tensors now.
    pub reserved: u64,
    pub allocated: u64,
    /// Segments held now.
    pub segments: u64,
    /// Device allocations, device frees, and allocation retries (cache flushes), in all.
    pub allocs: u64,
    pub frees: u64,
    pub retries: u64,
    /// CUDA graph captures begun and ended there, in all (their memory pools are device
    /// allocations that are no churn); left out where none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub graphs: u64,
}

impl From<&AllocatorSample> for WireAlloc {
    fn from(s: &AllocatorSample) -> Self {
        let st = &s.stats;
        WireAlloc {
            cuda: s.cuda,
            reserved: st.reserved_bytes,
            allocated: st.allocated_bytes,
            segments: st.segments,
            allocs: st.device_allocs,
            frees: st.device_frees,
            retries: st.alloc_retries,
            graphs: st.graph_events,
        }
    }
}

impl From<&WireAlloc> for AllocatorSample {
    fn from(a: &WireAlloc) -> Self {
        AllocatorSample {
            cuda: a.cuda,
            stats: AllocatorStats {
                reserved_bytes: a.reserved,
                allocated_bytes: a.allocated,
                segments: a.segments,
                device_allocs: a.allocs,
                device_frees: a.frees,
                alloc_retries: a.retries,
                graph_events: a.graphs,
            },
        }
    }
}

/// One GPU of the producer's host as NVML reads it there (once a second, in the samples that
/// follow a reading): for a viewer on another host, which cannot read it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WireGpu {
    /// NVML's index, and the `cuda:N` it is in the producer (none where hidden).
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<u32>,
    pub name: String,
    /// SM and memory-bandwidth utilisation, percent.
    pub util: u32,
    pub bw: u32,
    /// Memory used (all processes) and in all, and the producer's own where NVML lists it, MiB.
    pub used: u64,
    pub total: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ours: Option<u64>,
    /// Watts, SM clock MHz, degrees C, throttle reasons.
    pub w: f64,
    pub mhz: u32,
    pub temp: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<String>,
}

impl From<&GpuSample> for WireGpu {
    fn from(g: &GpuSample) -> Self {
        WireGpu {
            index: g.index,
            cuda: g.cuda,
            name: g.name.clone(),
            util: g.util_pct,
            bw: g.mem_bw_pct,
            used: g.mem_used_mib,
            total: g.mem_total_mib,
            ours: g.proc_mem_mib,
            w: g.power_w,
            mhz: g.sm_clock_mhz,
            temp: g.temp_c,
            throttle: g.throttle.clone(),
        }
    }
}

impl From<&WireGpu> for GpuSample {
    fn from(g: &WireGpu) -> Self {
        GpuSample {
            index: g.index,
            name: g.name.clone(),
            util_pct: g.util,
            mem_bw_pct: g.bw,
            mem_used_mib: g.used,
            mem_total_mib: g.total,
            proc_mem_mib: g.ours,
            power_w: g.w,
            sm_clock_mhz: g.mhz,
            temp_c: g.temp,
            cuda: g.cuda,
            throttle: g.throttle.clone(),
        }
    }
}

/// Ten times a second: the switches, the live steps, the queues, the caching allocator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub now: u64,
    pub prof: bool,
    pub timing: GpuTiming,
    pub paused: bool,
    /// Step records the producer itself dropped.
    pub dropped: u64,
    pub live: Vec<WireLive>,
    pub q: Vec<WireQueue>,
    /// The caching allocator on each CUDA device the producer's threads declared, where it
    /// reads it; none from a producer that does not (the CPU, CUDA not initialised, an older
    /// peer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alloc: Vec<WireAlloc>,
    /// The producer host's GPUs, in the samples that follow an NVML reading; none from a
    /// producer that does not read them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu: Vec<WireGpu>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Msg {
    Hello(Hello),
    Thread(ThreadDecl),
    Queue(QueueDecl),
    Step(WireStep),
    Sample(Sample),
    Status {
        text: String,
    },
    /// Frames this viewer missed, in all, because it read too slowly.
    Dropped {
        frames: u64,
    },
    /// Viewer to producer: a control key.
    Command {
        cmd: HubCommand,
    },
    /// Producer to viewer, then the connection closes.
    Refused {
        reason: String,
    },
    /// A kind this version does not know (a newer peer of the same version): skipped.
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod tests;
