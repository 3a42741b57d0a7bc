//! `bench replicas` across the processes of a job: each rank one replica, checked against rank
//! 0's weights (exchanged through the job's store) and against a single drafter it steps on all
//! the rows.

use super::{anchors_by_row, bench_step, max_diff, slice_rows, ReplicaReport};
use crate::cancel::CancelToken;
use crate::engine::data::Packer;
use crate::engine::drafter_step::{DrafterStep, Unprobed};
use crate::engine::optim::AdamW;
use crate::engine::pipeline::{build_drafters, build_target, data_source};
use crate::engine::replicas::Single;
use crate::engine::spec::PipelineSpec;
use crate::engine::target_graph::TargetForward;
use crate::engine::workers::DataCounts;
use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

/// The check across the processes of a job (`bench replicas` under torchrun's variables): each
/// rank is one replica, taking its rank's share of every batch, and also steps a single drafter
/// on all the rows; every rank builds the same batches from the unsharded data. The report is
/// this rank's: its weights against rank 0's (exchanged through the store) and against its
/// single drafter, and the ranks' mean loss per step.
pub fn run_ranks(cfg: &PipelineSpec, steps: u64) -> Result<ReplicaReport> {
    crate::engine::fast_paths::install(cfg.fast_paths);
    let tag = cfg.job.as_ref().context("a job's rank")?;
    let link = crate::engine::ranks::join_job(cfg, tag)?;
    let cancel = CancelToken::new();
    let (world, rank) = (tag.world as i64, tag.rank as i64);
    tch::manual_seed(cfg.seed as i64);
    let dev = cfg.drafter_devices[0];
    let target_device = cfg.target_devices[0];
    let (_target_vs, target) = build_target(
        cfg,
        &cfg.target_config,
        &cfg.drafter_spec.target_layer_ids,
        target_device,
    )?;
    // Every rank reads the whole stream: the check hands out the rows itself.
    let whole = PipelineSpec {
        job: None,
        ..cfg.clone()
    };
    let counts = std::sync::Arc::new(DataCounts::default());
    let mut source = data_source(&whole, &cfg.target_config, &cfg.drafter_spec, &counts)?;
    let mut packer = Packer::new();
    let step_for = |replicas| -> Result<DrafterStep> {
        let (vs, model, dev) = build_drafters(cfg, &[dev])?
            .pop()
            .context("a drafter was built")?;
        let frozen = (&target.embed_tokens, &target.lm_head);
        let graphs = crate::engine::drafter_graph::StepGraphs::off();
        let mut step = bench_step(cfg, frozen, (model, &vs, dev), replicas, graphs);
        step.prepare()?;
        // The optimizer holds the parameters; the var store may go.
        drop(vs);
        Ok(step)
    };
    let mut replica = step_for(Box::new(crate::engine::rank_replica::JobMember::new(
        link.clone(),
        cancel.clone(),
        dev.is_cuda(),
    )?))?;
    let mut single = step_for(Box::new(Single))?;
    let mut forward = TargetForward::new(&target, target_device);
    let rows = cfg.batch;
    let mut losses = Vec::new();
    let wait = std::time::Duration::from_secs(120);
    for s in 0..steps {
        let batch = packer.pack(source.as_mut(), rows * world, cfg.seq_len)?;
        let hidden = {
            let _g = tch::no_grad_guard();
            forward.run(&target, &batch, false)?
        };
        let anchors = anchors_by_row(&batch, cfg, s);
        let lr = cfg.schedule.lr(cfg.lr, s);
        let range = rank * rows..(rank + 1) * rows;
        let mine = replica.run(
            &hidden.narrow(0, range.start, rows).copy(),
            &slice_rows(&batch, range.clone()),
            &anchors[range.start as usize..range.end as usize],
            lr,
            &mut Unprobed,
        )?;
        let all = single.run(&hidden, &batch, &anchors, lr, &mut Unprobed)?;
        let mean = mean_loss(&link, (s, world), mine.loss, &cancel, wait)?;
        losses.push((mean, all.loss));
    }
    let replica_diff = diff_from_rank_0(&link, &mut replica.optimizer, &cancel, wait)?;
    let single_diff = max_diff(&mut replica.optimizer, &mut single.optimizer);
    link.finish(&Ok(()));
    Ok(ReplicaReport {
        losses,
        replica_diff,
        single_diff,
    })
}

/// The mean of the `world` ranks' losses at step `s`, this rank's `loss` among them.
fn mean_loss(
    link: &crate::engine::ranks::JobLink,
    (s, world): (u64, i64),
    loss: f32,
    cancel: &CancelToken,
    wait: std::time::Duration,
) -> Result<f32> {
    let theirs = link.exchange(&format!("loss/{s}"), &loss.to_le_bytes(), cancel, wait)?;
    let sum: f32 = theirs
        .iter()
        .map(|b| f32::from_le_bytes(b[..4].try_into().unwrap_or([0; 4])))
        .sum();
    Ok(sum / world as f32)
}

/// The largest |weight difference| between this rank's replica and rank 0's (weights exchanged
/// through the store).
fn diff_from_rank_0(
    link: &crate::engine::ranks::JobLink,
    replica: &mut AdamW,
    cancel: &CancelToken,
    wait: std::time::Duration,
) -> Result<f64> {
    let mine = replica.flat_params().to_device(Device::Cpu);
    let bytes = tensor_bytes(&mine)?;
    let every = link.exchange("weights", &bytes, cancel, wait)?;
    let first = Tensor::from_slice(&bytes_f32(&every[0])).view_as(&mine);
    Ok(f64::try_from(
        (&mine - first).abs().max().to_kind(Kind::Double),
    )?)
}

/// A float tensor's values as little-endian bytes.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let v = Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1))?;
    Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
