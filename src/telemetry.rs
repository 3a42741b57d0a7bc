//! Telemetry: phases, per-thread recorders, monitored queues, the hub and its snapshots.

pub mod allocator;
pub mod assemble;
pub mod clock;
pub mod flight;
pub mod host;
pub mod hub;
pub mod live;
pub mod names;
pub mod owner;
pub mod phase;
pub mod phase_recorder;
pub mod placement;
pub mod queue;
pub mod queue_view;
pub mod snapshot;
pub mod snapshot_lines;
pub mod stages;
pub mod stall;
pub mod switches;
pub mod trace;
pub mod verdict;
pub mod warning;
pub mod warnings;
pub mod window;

pub use hub::{HubCommand, Telemetry};
pub use phase::{Phase, Role, N_PHASES};
pub use phase_recorder::{CudaCalls, PhaseRecorder, StepRecord, TrainMetrics};
pub use snapshot::Snapshot;
pub use switches::{GpuTiming, Switches};
