//! The drafter alone (`bench drafter`): its step's phases timed with nothing else on the device.
//! The target computes a few batches of hidden states once; the drafter then trains on them in
//! turn, on a stream of its own as the worker's (so its CUDA graphs run as in training), and the
//! host waits for the device at every phase mark: each phase's time is its own device time,
//! which the shared-GPU run of `bench engine` cannot give (there the target's forward overlaps
//! the drafter's phases).

use crate::engine::data::{PackedBatch, Packer};
use crate::engine::gpu::kernel_time::{KernelTally, KernelWindow};
use crate::engine::model::target_graph::TargetForward;
use crate::engine::pipeline::workers::DataCounts;
use crate::engine::pipeline::{build_drafters, build_target, data_source};
use crate::engine::spec::PipelineSpec;
use crate::engine::train::grad_mean::Single;
use crate::engine::train::step::StepProbe;
use crate::telemetry::Phase;
use anyhow::{Context, Result};
use std::time::Instant;
use tch::{Device, Tensor};

/// Batches of hidden states computed once and trained on in turn.
const BATCHES: usize = 4;
/// Steps before the timed ones (graph captures, the allocator's first sizes).
const WARM_UP: u64 = 5;

/// Milliseconds a step per phase over the timed steps.
#[derive(Debug, Default, Clone)]
pub struct PhaseTimes {
    pub steps: u64,
    /// (phase, total ms over the steps), in the order the step marks them.
    pub ms: Vec<(Phase, f64)>,
}

impl PhaseTimes {
    /// Milliseconds a step in `phase` (0 when it never ran).
    pub fn per_step(&self, phase: Phase) -> f64 {
        let total: f64 = self
            .ms
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, ms)| ms)
            .sum();
        total / self.steps.max(1) as f64
    }

    pub fn step_ms(&self) -> f64 {
        self.ms.iter().map(|(_, ms)| ms).sum::<f64>() / self.steps.max(1) as f64
    }

    fn add(&mut self, phase: Phase, ms: f64) {
        match self.ms.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, t)) => *t += ms,
            None => self.ms.push((phase, ms)),
        }
    }
}

/// A probe that waits for the device at every mark and charges the time since the last one to
/// the phase that was running.
struct SyncedPhases {
    device: Device,
    at: Instant,
    phase: Option<Phase>,
    times: PhaseTimes,
    timing: bool,
}

impl SyncedPhases {
    fn wait_for_device(&self) {
        if let Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
    }

    /// Ends the running phase (after the step).
    fn close(&mut self) {
        self.wait_for_device();
        if let (Some(p), true) = (self.phase.take(), self.timing) {
            self.times.add(p, self.at.elapsed().as_secs_f64() * 1e3);
        }
    }
}

impl StepProbe for SyncedPhases {
    fn mark(&mut self, phase: Phase) {
        self.close();
        self.phase = Some(phase);
        self.at = Instant::now();
    }

    fn own_stream(&self) -> bool {
        self.device.is_cuda() && crate::cuda_shim::AVAILABLE
    }
}

/// Trains the drafter of `cfg` for `steps` timed steps (after a warm-up) on `BATCHES` batches of
/// hidden states from its target; the target on `cfg.target_devices[0]`, the drafter on
/// `cfg.drafter_devices[0]`. With `kernels`, libtorch's profiler reads every kernel of the timed
/// steps (the drafter's alone: the target's ran before them) into a tally by class.
pub fn run(
    cfg: &PipelineSpec,
    steps: u64,
    kernels: bool,
) -> Result<(PhaseTimes, Option<KernelTally>)> {
    crate::engine::gpu::fast_paths::install(cfg.fast_paths);
    tch::manual_seed(cfg.seed as i64);
    let (target_dev, dev) = (cfg.target_devices[0], cfg.drafter_devices[0]);
    let spec = &cfg.drafter_spec;
    let (_target_vs, target) =
        build_target(cfg, &cfg.target_config, &spec.target_layer_ids, target_dev)?;
    let counts = std::sync::Arc::new(DataCounts::default());
    let mut source = data_source(cfg, &cfg.target_config, spec, &counts)?;
    let mut packer = Packer::new();
    let mut forward = TargetForward::new(&target, target_dev);
    let mut batches: Vec<(Tensor, PackedBatch)> = Vec::new();
    for _ in 0..BATCHES {
        let b = packer.pack(source.as_mut(), cfg.batch, cfg.seq_len)?;
        let b = b.to_device(target_dev);
        let hidden = {
            let _g = tch::no_grad_guard();
            forward.run(&target, &b, false)?
        };
        batches.push((hidden.to_device(dev), b.to_device(dev)));
    }
    let (vs, model, _) = build_drafters(cfg, &[dev])?
        .pop()
        .context("a drafter was built")?;
    let _stream = crate::engine::gpu::cuda::Stream::own(dev)?; // as the worker has
    let mut step = super::replica_check::bench_step(
        cfg,
        (&target.embed_tokens, &target.lm_head),
        (model, &vs, dev),
        Box::new(Single),
        crate::engine::train::step_graphs::StepGraphs::as_installed(),
    );
    step.prepare()?;
    let mut probe = SyncedPhases {
        device: dev,
        at: Instant::now(),
        phase: None,
        times: PhaseTimes::default(),
        timing: false,
    };
    let mut window = None;
    for s in 0..WARM_UP + steps {
        probe.timing = s >= WARM_UP;
        if kernels && s == WARM_UP {
            window = Some(KernelWindow::start()?);
        }
        let (hidden, b) = &batches[s as usize % BATCHES];
        let anchors = super::replica_check::anchors_by_row(b, cfg, s);
        let lr = cfg.schedule.lr(cfg.lr, s);
        step.run(hidden, b, &anchors, lr, &mut probe)?;
        probe.close();
    }
    probe.times.steps = steps;
    let tally = window.map(KernelWindow::stop).transpose()?;
    Ok((probe.times, tally))
}
