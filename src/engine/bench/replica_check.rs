//! The replica check behind `bench replicas`: D drafter replicas, each on its own device and its
//! own share of every batch, against one drafter that takes the whole batch — same start, same
//! data, same anchors. Data parallelism is right when the replicas end with identical weights
//! (each step's gradients averaged) and their mean loss follows the single drafter's curve. In a
//! job of several processes each rank runs its D replicas of the job's and the same single
//! drafter (src/engine/bench/replica_check/across_ranks.rs says how the ranks compare). The
//! replicas' threads and the steps that feed them: src/engine/bench/replica_check/lockstep.rs.

use crate::cancel::CancelToken;
use crate::engine::data::{PackedBatch, Packer, Rng};
use crate::engine::model::target_graph::TargetForward;
use crate::engine::parallel::ranks::JobLink;
use crate::engine::pipeline::workers::DataCounts;
use crate::engine::pipeline::{
    build_drafters, build_target, check_replica_devices, data_source, frozen_on, replica_group,
    Replicas,
};
use crate::engine::spec::PipelineSpec;
use crate::engine::train::blocks::sample_anchors;
use crate::engine::train::grad_mean::Single;
use crate::engine::train::optim::AdamW;
use crate::engine::train::step::DrafterStep;
use anyhow::{bail, Context, Result};
use crossbeam_channel::bounded;
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

mod across_ranks;
mod lockstep;
use lockstep::{join_replicas, spawn_replicas, synchronize, Lockstep};

/// What the check measured.
pub struct ReplicaReport {
    /// Per step: the replicas' mean loss and the single drafter's loss.
    pub losses: Vec<(f32, f32)>,
    /// Largest |weight difference| between replica 0 and each other replica, after the last step.
    pub replica_diff: f64,
    /// Largest |weight difference| between replica 0 and the single drafter.
    pub single_diff: f64,
}

/// |r - s| / |s|: how far the replicas' mean loss `r` is from the single drafter's `s`.
pub(crate) fn relative_gap(r: f64, s: f64) -> f64 {
    (r - s).abs() / s.abs().max(1e-6)
}

impl ReplicaReport {
    /// Largest |replica mean loss - single loss| / single loss over single steps.
    pub fn step_gap(&self) -> f64 {
        self.losses
            .iter()
            .map(|(r, s)| relative_gap(*r as f64, *s as f64))
            .fold(0.0, f64::max)
    }
}

/// Anchors of every row of `b`, each row from a sampler seeded by the step and the row, so that
/// a replica and the single drafter draw the same anchors for the same row.
pub(crate) fn anchors_by_row(b: &PackedBatch, cfg: &PipelineSpec, step: u64) -> Vec<Vec<i64>> {
    let seq = b.seq as usize;
    (0..b.rows as usize)
        .map(|r| {
            let mut rng = Rng::new(cfg.seed ^ (step << 20) ^ r as u64);
            let span = r * seq..(r + 1) * seq;
            sample_anchors(
                &b.host_doc_ids[span.clone()],
                &b.host_loss_mask[span],
                cfg.anchors as usize,
                cfg.anchor_scope,
                &mut rng,
            )
        })
        .collect()
}

/// The largest |difference| between two optimizers' master weights.
fn max_diff(a: &mut AdamW, b: &mut AdamW) -> f64 {
    gap(a.flat_params(), b.flat_params())
}

/// `max_diff` between two replicas, and between the bf16 weights their models read where they
/// have them: equal masters round to equal weights, so a replica whose working weights missed an
/// update shows there.
fn replicas_apart(a: &mut AdamW, b: &mut AdamW) -> f64 {
    let masters = max_diff(a, b);
    match (a.working_params(), b.working_params()) {
        (Some(x), Some(y)) => masters.max(gap(x, y)),
        _ => masters,
    }
}

fn gap(x: &Tensor, y: &Tensor) -> f64 {
    let (x, y) = (x.to_device(Device::Cpu), y.to_device(Device::Cpu));
    let d = (x.to_kind(Kind::Double) - y.to_kind(Kind::Double))
        .abs()
        .max();
    f64::try_from(d).unwrap_or(f64::INFINITY)
}

/// Runs `steps` steps of the replicas on `cfg.drafter_devices` (each taking `cfg.batch` rows)
/// and of one drafter on the first of them taking all the rows, fed by one target on
/// `cfg.target_devices[0]`. In a job (`cfg.job`) these replicas are this rank's share of the
/// job's, and the single drafter takes every rank's rows.
pub fn run(cfg: &PipelineSpec, steps: u64) -> Result<ReplicaReport> {
    crate::engine::gpu::fast_paths::install(cfg.fast_paths);
    let Some(tag) = &cfg.job else {
        if cfg.drafter_devices.len() < 2 {
            bail!(
                "bench replicas compares two or more drafter replicas with one drafter: give \
                 --drafter-devices two or more devices (e.g. cuda:0,cuda:1 or cpu,cpu)"
            );
        }
        return check(cfg, steps, None);
    };
    let link = crate::engine::parallel::ranks::join_job(cfg, tag)?;
    let report = check(cfg, steps, Some(&link));
    // The others hear why this rank stopped.
    link.finish(
        &report
            .as_ref()
            .map(|_| ())
            .map_err(|e| anyhow::anyhow!("{e:#}")),
    );
    report
}

fn check(cfg: &PipelineSpec, steps: u64, link: Option<&Arc<JobLink>>) -> Result<ReplicaReport> {
    let devices = cfg.drafter_devices.clone();
    tch::manual_seed(cfg.seed as i64);
    let target_device = cfg.target_devices[0];
    let (_target_vs, target) = build_target(
        cfg,
        &cfg.target_config,
        &cfg.drafter_spec.target_layer_ids,
        target_device,
    )?;
    let frozen = (
        target.embed_tokens.shallow_clone(),
        target.lm_head.shallow_clone(),
    );
    let counts = std::sync::Arc::new(DataCounts::default());
    // Every rank of a job reads the whole stream: the check hands out the rows itself.
    let whole = PipelineSpec {
        job: None,
        ..cfg.clone()
    };
    let source = data_source(&whole, &cfg.target_config, &cfg.drafter_spec, &counts)?;
    let packer = Packer::new();

    let cancel = CancelToken::new();
    let group = match link {
        Some(l) => Replicas::Job(l.clone(), cancel.clone(), check_replica_devices(&devices)?),
        None => replica_group(&devices, &cancel)?,
    };
    let models = build_drafters(cfg, &devices)?;
    let (_single_vs, mut single) = single_drafter(cfg, devices[0], &frozen)?;
    let (outcome_tx, outcome_rx) = bounded(devices.len());
    let report = std::thread::scope(|scope| -> Result<ReplicaReport> {
        let steps_of = replica_steps(cfg, &frozen, models, &group)?;
        // What this thread queued on the devices' default streams (weights, optimizer state) is
        // done before the replicas read it on streams of their own.
        synchronize(&devices);
        let (feeds, handles) = spawn_replicas(scope, steps_of, outcome_tx)?;
        let mut lockstep = Lockstep {
            cfg,
            devices: &devices,
            replicas: link.map_or(0..devices.len(), |l| {
                l.replica_index(0)..l.replica_index(devices.len())
            }),
            total: link.map_or(devices.len(), |l| l.replicas()),
            target: &target,
            target_device,
            forward: TargetForward::new(&target, target_device),
            source,
            packer,
            feeds,
            outcomes: outcome_rx,
        };
        let mut losses = Vec::new();
        for s in 0..steps {
            let (sum, whole) = lockstep.step(s, &mut single)?;
            let sum = match link {
                Some(l) => across_ranks::loss_sum(l, s, sum, &cancel)?,
                None => sum,
            };
            losses.push((sum / lockstep.total as f32, whole));
        }
        // The replicas' channels close: each ends its loop.
        lockstep.feeds.clear();
        let mut optimizers = join_replicas(handles)?;
        let (first, rest) = optimizers.split_first_mut().context("replicas ran")?;
        let mut replica_diff = rest
            .iter_mut()
            .map(|o| replicas_apart(first, o))
            .fold(0.0, f64::max);
        if let Some(l) = link {
            replica_diff = replica_diff.max(across_ranks::diff_from_rank_0(l, first, &cancel)?);
        }
        Ok(ReplicaReport {
            losses,
            replica_diff,
            single_diff: max_diff(first, &mut single.optimizer),
        })
    })?;
    Ok(report)
}

/// The single drafter, on `dev`, ready to step (its var store kept beside it).
fn single_drafter(
    cfg: &PipelineSpec,
    dev: Device,
    frozen: &(Tensor, Tensor),
) -> Result<(tch::nn::VarStore, DrafterStep)> {
    let (vs, model, dev) = {
        let mut one = build_drafters(cfg, &[dev])?;
        one.pop().context("a drafter was built")?
    };
    let graphs = crate::engine::train::step_graphs::StepGraphs::off();
    let frozen = (&frozen.0, &frozen.1);
    let mut single = bench_step(cfg, frozen, (model, &vs, dev), Box::new(Single), graphs);
    single.prepare()?;
    Ok((vs, single))
}

/// The replicas' steps, each with its var store, member `i` of `group`.
fn replica_steps(
    cfg: &PipelineSpec,
    frozen: &(Tensor, Tensor),
    models: Vec<(
        tch::nn::VarStore,
        crate::engine::model::drafter::Drafter,
        Device,
    )>,
    group: &crate::engine::pipeline::Replicas,
) -> Result<Vec<(tch::nn::VarStore, DrafterStep)>> {
    models
        .into_iter()
        .enumerate()
        .map(|(i, (vs, model, dev))| {
            let graphs = crate::engine::train::step_graphs::StepGraphs::off();
            let frozen = (&frozen.0, &frozen.1);
            let step = bench_step(cfg, frozen, (model, &vs, dev), group.member(i)?, graphs);
            Ok((vs, step))
        })
        .collect()
}

/// A drafter step of the checks and benches: `model` (with its var store and device) trained by
/// a fresh AdamW, reading the target's frozen (embedding, lm head).
pub(crate) fn bench_step(
    cfg: &PipelineSpec,
    frozen: (&Tensor, &Tensor),
    (model, vs, dev): (
        crate::engine::model::drafter::Drafter,
        &tch::nn::VarStore,
        Device,
    ),
    replicas: Box<dyn crate::engine::train::grad_mean::GradMean>,
    graphs: crate::engine::train::step_graphs::StepGraphs,
) -> DrafterStep {
    DrafterStep {
        model,
        optimizer: AdamW::for_drafter(vs.variables().into_iter().collect(), cfg.optimizer_states),
        spec: cfg.drafter_spec.clone(),
        embed: frozen_on(frozen.0, dev),
        lm_head: frozen_on(frozen.1, dev),
        device: dev,
        replicas,
        loss_chunk_mib: cfg.loss_chunk_mib,
        graphs,
    }
}

#[cfg(test)]
mod tests;
