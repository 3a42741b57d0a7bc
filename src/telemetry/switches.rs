//! Runtime switches the front-end flips while training runs; the workers only read them.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

/// How GPU work is attributed to phases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuTiming {
    /// Host wall time: queued CUDA work lands in whichever phase next waits on the device.
    Async,
    /// Synchronize the worker's stream at every phase boundary: true attribution, at a cost.
    Sync,
    /// CUDA events on the worker's stream at every mark, read back steps later: device time per
    /// phase without stalling the pipeline (the default on CUDA).
    Events,
}

impl GpuTiming {
    pub const ALL: [GpuTiming; 3] = [GpuTiming::Async, GpuTiming::Events, GpuTiming::Sync];

    pub fn name(self) -> &'static str {
        match self {
            GpuTiming::Async => "async",
            GpuTiming::Sync => "sync",
            GpuTiming::Events => "events",
        }
    }

    pub fn parse(s: &str) -> Option<GpuTiming> {
        GpuTiming::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The `g` key's order: async, events, sync.
    pub fn next(self) -> GpuTiming {
        match self {
            GpuTiming::Async => GpuTiming::Events,
            GpuTiming::Events => GpuTiming::Sync,
            GpuTiming::Sync => GpuTiming::Async,
        }
    }
}

/// How a step's phase times were measured; a window never mixes two of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Timing {
    /// Host wall time on a CPU worker (GPU timing modes do not apply).
    #[default]
    Host,
    /// Host wall time on a GPU worker (`async`).
    GpuAsync,
    /// Host wall time with the worker's stream synchronized at each mark (`sync`).
    GpuSync,
    /// Device time from CUDA events (`events`).
    GpuEvents,
}

impl Timing {
    pub fn of(mode: GpuTiming) -> Timing {
        match mode {
            GpuTiming::Async => Timing::GpuAsync,
            GpuTiming::Sync => Timing::GpuSync,
            GpuTiming::Events => Timing::GpuEvents,
        }
    }
}

#[derive(Debug)]
pub struct Switches {
    profiling: AtomicBool,
    /// Bumped on every profiling toggle, so a recorder can tell whether a whole step was profiled
    /// without touching anything on the off path.
    profiling_epoch: AtomicU64,
    gpu_timing: AtomicU8,
    paused: AtomicBool,
    /// Not a toggle but a fact of the run the hub passes on: the stage cost ratio estimated from
    /// FLOPs (f64 bits; 0 when not set).
    stage_ratio_flops: AtomicU64,
    /// Another fact of the run: why CUPTI does not count the CUDA threads' calls (None: it
    /// does, or the producer never counts them). Read once a snapshot, never on a worker's path.
    cupti: Mutex<Option<String>>,
}

impl Default for Switches {
    fn default() -> Self {
        Switches {
            profiling: AtomicBool::new(true),
            profiling_epoch: AtomicU64::new(0),
            gpu_timing: AtomicU8::new(GpuTiming::Async as u8),
            paused: AtomicBool::new(false),
            stage_ratio_flops: AtomicU64::new(0),
            cupti: Mutex::new(None),
        }
    }
}

impl Switches {
    #[inline(always)]
    pub fn profiling(&self) -> bool {
        self.profiling.load(Relaxed)
    }

    pub fn set_profiling(&self, on: bool) {
        self.profiling.store(on, Relaxed);
        self.profiling_epoch.fetch_add(1, Relaxed);
    }

    pub fn profiling_epoch(&self) -> u64 {
        self.profiling_epoch.load(Relaxed)
    }

    pub fn gpu_timing(&self) -> GpuTiming {
        match self.gpu_timing.load(Relaxed) {
            1 => GpuTiming::Sync,
            2 => GpuTiming::Events,
            _ => GpuTiming::Async,
        }
    }

    pub fn set_gpu_timing(&self, mode: GpuTiming) {
        self.gpu_timing.store(mode as u8, Relaxed);
    }

    pub fn set_stage_ratio_flops(&self, ratio: f64) {
        self.stage_ratio_flops.store(ratio.to_bits(), Relaxed);
    }

    pub fn stage_ratio_flops(&self) -> Option<f64> {
        let r = f64::from_bits(self.stage_ratio_flops.load(Relaxed));
        (r.is_finite() && r > 0.0).then_some(r)
    }

    /// Why CUPTI does not count CUDA calls in this run (None: it does, or nothing says).
    pub fn set_cupti(&self, why: Option<String>) {
        *self.cupti.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    pub fn cupti(&self) -> Option<String> {
        self.cupti.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    pub fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Relaxed);
    }
}
