//! The replica check's threads and steps (src/engine/bench/replica_check.rs): a thread per
//! replica fed its share of each step through a channel of its own, the step that runs a batch
//! through the target, hands each replica its rows and trains the single drafter on all of them,
//! and the join that gives back the replicas' optimizers.

use super::anchors_by_row;
use crate::engine::data::{PackedBatch, Packer};
use crate::engine::model::target_graph::TargetForward;
use crate::engine::spec::PipelineSpec;
use crate::engine::train::optim::AdamW;
use crate::engine::train::step::{DrafterStep, StepOutcome, Unprobed};
use anyhow::{bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use std::ops::Range;
use tch::{Device, Tensor};

/// One replica's share of a step: hidden states and batch on its device, its rows' anchors.
pub(super) struct Share {
    hidden: Tensor,
    batch: PackedBatch,
    anchors: Vec<Vec<i64>>,
    lr: f64,
}

/// A replica's thread: joins the group, then one step per share until the channel closes.
fn replica_loop(
    mut step: DrafterStep,
    shares: Receiver<Share>,
    out: Sender<Result<StepOutcome>>,
) -> Result<AdamW> {
    let _stream = crate::engine::gpu::cuda::Stream::own(step.device)?; // as the workers have
    step.prepare()?;
    for s in shares {
        let r = step.run(&s.hidden, &s.batch, &s.anchors, s.lr, &mut Unprobed);
        let failed = r.is_err();
        if out.send(r).is_err() || failed {
            break;
        }
    }
    Ok(step.optimizer)
}

/// Waits until the work queued on each CUDA device in `devices` is done.
pub(super) fn synchronize(devices: &[Device]) {
    for d in devices {
        if let Device::Cuda(i) = d {
            tch::Cuda::synchronize(*i as i64);
        }
    }
}

pub(super) type ReplicaHandle<'scope> = std::thread::ScopedJoinHandle<'scope, Result<AdamW>>;

/// One named thread per replica, fed through a channel of its own; their outcomes go to `out`.
pub(super) fn spawn_replicas<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    steps: Vec<(tch::nn::VarStore, DrafterStep)>,
    out: Sender<Result<StepOutcome>>,
) -> Result<(Vec<Sender<Share>>, Vec<ReplicaHandle<'scope>>)> {
    let mut feeds = Vec::new();
    let mut handles = Vec::new();
    for (i, (vs, step)) in steps.into_iter().enumerate() {
        let (tx, rx) = bounded::<Share>(1);
        let out = out.clone();
        feeds.push(tx);
        let handle = std::thread::Builder::new()
            .name(format!("replica-{i}"))
            .spawn_scoped(scope, move || {
                let _keep = vs;
                replica_loop(step, rx, out)
            })
            .context("cannot start a replica thread")?;
        handles.push(handle);
    }
    Ok((feeds, handles))
}

/// The check's steps: one target and its data feed the replicas and the single drafter.
pub(super) struct Lockstep<'a> {
    pub(super) cfg: &'a PipelineSpec,
    pub(super) devices: &'a [Device],
    /// The indices of this process's replicas among all (`total`); each takes the batch's rows
    /// of its index.
    pub(super) replicas: Range<usize>,
    pub(super) total: usize,
    pub(super) target: &'a crate::engine::model::qwen3::Qwen3Target,
    pub(super) target_device: Device,
    pub(super) forward: TargetForward,
    pub(super) source: Box<dyn crate::engine::data::DocSource>,
    pub(super) packer: Packer,
    /// One channel per replica.
    pub(super) feeds: Vec<Sender<Share>>,
    pub(super) outcomes: Receiver<Result<StepOutcome>>,
}

impl Lockstep<'_> {
    /// Step `s`: a batch through the target, each replica's share sent to it, all of it through
    /// `single`. Returns the sum of this process's replicas' losses and the single drafter's.
    pub(super) fn step(&mut self, s: u64, single: &mut DrafterStep) -> Result<(f32, f32)> {
        let (cfg, devices, rows) = (self.cfg, self.devices, self.cfg.batch);
        let batch =
            self.packer
                .pack(self.source.as_mut(), rows * self.total as i64, cfg.seq_len)?;
        let batch = batch.to_device(self.target_device);
        let hidden = {
            let _g = tch::no_grad_guard();
            self.forward.run(self.target, &batch, false)?
        };
        let anchors = anchors_by_row(&batch, cfg, s);
        let lr = cfg.schedule.lr(cfg.lr, s);
        let first_row = self.replicas.start as i64 * rows;
        let shares = shares(&hidden, &batch, &anchors, (devices, first_row), rows, lr);
        // The forward and the copies ran on this thread's default streams; the replicas read
        // them on streams of their own, which do not wait for those.
        synchronize(&[self.target_device]);
        synchronize(devices);
        for (feed, share) in self.feeds.iter().zip(shares) {
            if feed.send(share).is_err() {
                break;
            }
        }
        let single_dev = single.device;
        let whole = single.run(
            &hidden.to_device(single_dev),
            &batch.to_device(single_dev),
            &anchors,
            lr,
            &mut Unprobed,
        )?;
        let mut sum = 0.0;
        for _ in 0..devices.len() {
            let r = self
                .outcomes
                .recv()
                .context("a replica stopped before the end of the check")??;
            sum += r.loss;
        }
        Ok((sum, whole.loss))
    }
}

/// Each replica's share of a step: its `rows` rows of the batch (the replica on `devices[i]`
/// those from `first_row + i * rows`), its hidden states and anchors, on its device.
fn shares(
    hidden: &Tensor,
    batch: &PackedBatch,
    anchors: &[Vec<i64>],
    (devices, first_row): (&[Device], i64),
    rows: i64,
    lr: f64,
) -> Vec<Share> {
    devices
        .iter()
        .enumerate()
        .map(|(i, &dev)| {
            let start = first_row + i as i64 * rows;
            let range = start..start + rows;
            Share {
                hidden: hidden.narrow(0, range.start, rows).to_device(dev).copy(),
                batch: slice_rows(batch, range.clone()).to_device(dev),
                anchors: anchors[range.start as usize..range.end as usize].to_vec(),
                lr,
            }
        })
        .collect()
}

/// Joins the replicas: their optimizers, in order.
pub(super) fn join_replicas(handles: Vec<ReplicaHandle<'_>>) -> Result<Vec<AdamW>> {
    let mut optimizers = Vec::new();
    for h in handles {
        match h.join() {
            Ok(r) => optimizers.push(r?),
            Err(_) => bail!("a replica thread panicked"),
        }
    }
    Ok(optimizers)
}

/// A batch's rows `rows` (host copies and tensors), for one replica.
fn slice_rows(b: &PackedBatch, rows: Range<i64>) -> PackedBatch {
    let (n, seq) = (rows.end - rows.start, b.seq as usize);
    let host = rows.start as usize * seq..rows.end as usize * seq;
    PackedBatch {
        rows: n,
        seq: b.seq,
        input_ids: b.input_ids.narrow(0, rows.start, n),
        positions: b.positions.narrow(0, rows.start, n),
        doc_ids: b.doc_ids.narrow(0, rows.start, n),
        loss_mask: b.loss_mask.narrow(0, rows.start, n),
        host_doc_ids: b.host_doc_ids[host.clone()].to_vec(),
        host_loss_mask: b.host_loss_mask[host].to_vec(),
        docs_placed: b.docs_placed,
        truncated: 0,
        doc_tokens: b.doc_tokens * n as u64 / b.rows.max(1) as u64,
    }
}
