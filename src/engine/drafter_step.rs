//! One optimizer step of a drafter replica: from a batch's hidden states and its anchors to
//! updated weights, the gradients averaged over the replicas on the way. The drafter worker
//! (workers.rs) and the replica check (replica_check.rs) run this same step.

use super::blocks::{
    anchors_tensor, block_input_ids, block_labels, block_positions, label_rows, tiled_block_mask,
};
use super::config::DrafterSpec;
use super::cuda::upload;
use super::data::PackedBatch;
use super::drafter::Drafter;
use super::loss::{block_metrics, chunked_loss_backward_rows, gamma_for, slot_weights};
use super::optim::AdamW;
use super::replicas::GradMean;
use crate::telemetry::Phase;
use anyhow::Result;
use tch::{Device, Tensor};

/// What the caller does at the step's phase boundaries: mark them, inject faults; or nothing.
pub trait StepProbe {
    fn mark(&mut self, phase: Phase);
    /// Between the forward and the loss, with the drafter's output.
    fn after_forward(&mut self, _out: &mut Tensor) -> Result<()> {
        Ok(())
    }
}

/// A probe that does nothing (the replica check).
pub struct Unprobed;

impl StepProbe for Unprobed {
    fn mark(&mut self, _: Phase) {}
}

/// A step's figures, read back from the device in one transfer.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub loss: f32,
    pub tau: f32,
    pub grad_norm: f32,
    /// False: the loss or the gradients were not finite and the update was skipped.
    pub finite: bool,
    /// Accuracy per block slot.
    pub slot_acc: Vec<f32>,
}

/// A drafter replica with everything its step needs.
pub struct DrafterStep {
    pub model: Drafter,
    pub optimizer: AdamW,
    pub spec: DrafterSpec,
    pub embed: Tensor,
    pub lm_head: Tensor,
    pub device: Device,
    /// Averages gradients with the other replicas (data parallel).
    pub replicas: Box<dyn GradMean>,
    /// Lm-head chunk in the loss, MiB: rows x vocab x 4 bytes (bf16 logits and probabilities).
    pub loss_chunk_mib: i64,
}

/// Rows of lm-head logits per chunk: `mib` MiB at 4 bytes an entry (a bf16 logit and its
/// probability, which exist together).
fn chunk_rows(vocab: i64, mib: i64) -> i64 {
    ((mib.max(1) << 20) / (4 * vocab.max(1))).max(16)
}

impl DrafterStep {
    /// Once, on the thread that runs the steps, before the first: joins the replica group (on
    /// GPUs: replica 0's weights broadcast to all, gradients reduced during backward).
    pub fn prepare(&mut self) -> Result<()> {
        self.replicas.prepare(&mut self.optimizer)
    }

    /// One step on `hidden` (on this replica's device) and batch `b`, with `per_row` anchors (at
    /// least one row has some), at learning rate `lr`.
    pub fn run(
        &mut self,
        hidden: &Tensor,
        b: &PackedBatch,
        per_row: &[Vec<i64>],
        lr: f64,
        probe: &mut dyn StepProbe,
    ) -> Result<StepOutcome> {
        let (device, block) = (self.device, self.spec.block_size);
        let (ids, pos, docs, lmask) = (&b.input_ids, &b.positions, &b.doc_ids, &b.loss_mask);
        // Padded to a whole number of attention tiles: few distinct shapes, full tiles.
        let width = super::tiled::padded_width(per_row.iter().map(Vec::len).max().unwrap_or(0));
        let anch = anchors_tensor(per_row, width, device);
        let block_ids = block_input_ids(ids, &anch, block, self.spec.mask_token_id);
        let block_pos = block_positions(pos, &anch, block);
        let mask = super::tiled::AttnMask::Tiled(tiled_block_mask(
            docs,
            &anch,
            block,
            per_row,
            &b.host_doc_ids,
        ));
        let (labels, valid) = block_labels(ids, docs, lmask, &anch, block);
        let keep = upload(
            &Tensor::from_slice(&label_rows(
                per_row,
                width,
                block as usize,
                &b.host_doc_ids,
                &b.host_loss_mask,
                b.seq as usize,
            )),
            device,
        );
        probe.mark(Phase::Forward);
        let block_emb =
            Tensor::embedding(&self.embed, &block_ids, -1, false, false).to_kind(hidden.kind());
        let mut out = self
            .model
            .forward_masked(hidden, pos, &block_emb, &block_pos, &mask);
        probe.after_forward(&mut out)?;
        probe.mark(Phase::Loss);
        let (loss, backward) = chunked_loss_backward_rows(
            &out,
            &self.lm_head,
            &labels,
            &valid,
            &keep,
            &slot_weights(block, gamma_for(block)),
            chunk_rows(self.spec.layers.vocab_size, self.loss_chunk_mib),
        );
        probe.mark(Phase::Backward);
        backward();
        if self.replicas.syncs() {
            probe.mark(Phase::GradSync);
            self.replicas.mean(&mut self.optimizer)?;
        }
        probe.mark(Phase::Clip);
        let grad_norm = self.optimizer.clip_grad_norm(1.0);
        probe.mark(Phase::Optim);
        // A non-finite loss or gradient skips the update, decided on the device (no sync here).
        // Replicas decide on the averaged gradients' norm alone, the same on every replica (a
        // non-finite loss anywhere makes it non-finite), so that they skip together.
        let finite = if self.replicas.syncs() {
            grad_norm.isfinite()
        } else {
            loss.loss.isfinite().logical_and(&grad_norm.isfinite())
        };
        self.optimizer.step_if(lr, &finite);
        probe.mark(Phase::Metrics);
        let (acc, tau) = block_metrics(&loss.correct, &valid, &anch.valid);
        let packed = Tensor::cat(
            &[
                loss.loss.view([1]),
                tau.view([1]),
                grad_norm.view([1]),
                finite.to_kind(tch::Kind::Float).view([1]),
                acc,
            ],
            0,
        );
        let host = Vec::<f32>::try_from(packed.to_device(Device::Cpu))?; // the one transfer
        let finite = host[3] > 0.5;
        if !finite {
            self.optimizer.unstep();
        }
        Ok(StepOutcome {
            loss: host[0],
            tau: host[1],
            grad_norm: host[2],
            finite,
            slot_acc: host[4..].to_vec(),
        })
    }
}
