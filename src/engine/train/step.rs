//! One optimizer step of a drafter replica: from a batch's hidden states and its anchors to
//! updated weights, the gradients averaged over the replicas on the way. The drafter worker
//! (workers.rs) and the replica check (replica_check.rs) run this same step.

use super::blocks::{
    anchors_tensor, block_input_ids, block_labels, block_positions, label_rows, planned_block_mask,
    window_plan,
};
use super::loss::{
    backward_from, block_metrics, chunked_loss_rows, gamma_for, slot_weights, LossOut,
};
use super::optim::AdamW;
use crate::engine::data::PackedBatch;
use crate::engine::gpu::cuda::upload;
use crate::engine::model::drafter::Drafter;
use crate::engine::model::shapes::DrafterSpec;
use crate::engine::model::tiled::{AttnMask, WindowPlan};
use crate::engine::train::grad_mean::GradMean;
use crate::engine::train::step_graphs::{Forwarded, StepGraphs, StepInputs};
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
    /// In the loss phase, with the step's loss on the device.
    fn in_loss(&mut self, _loss: &Tensor) -> Result<()> {
        Ok(())
    }
    /// Whether the step runs on a CUDA stream of the thread's own (graphs need one).
    fn own_stream(&self) -> bool {
        false
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
    /// The step's CUDA graphs (`StepGraphs::off()`: every step eager).
    pub graphs: StepGraphs,
}

/// Rows of lm-head logits per chunk: `mib` MiB at 4 bytes an entry (a bf16 logit and its
/// probability, which exist together).
fn chunk_rows(vocab: i64, mib: i64) -> i64 {
    ((mib.max(1) << 20) / (4 * vocab.max(1))).max(16)
}

impl DrafterStep {
    /// Once, on the thread that runs the steps, before the first: joins the replica group (on
    /// GPUs: replica 0's weights broadcast to all, gradients reduced during backward). A lone
    /// replica on a GPU keeps its gradients in one flat buffer as well, so that the clip reads
    /// them in place instead of gathering a copy of them each step (5 GB at qwen3-32b).
    pub fn prepare(&mut self) -> Result<()> {
        self.replicas.prepare(&mut self.optimizer)?;
        let lone_on_gpu = !self.replicas.syncs() && self.device.is_cuda();
        if lone_on_gpu && crate::cuda_shim::AVAILABLE && !self.optimizer.grads_are_flat() {
            // The buffer stays the optimizer's (the parameters' `.grad` are views of it); where
            // it cannot be made, the gradients are gathered each step as before.
            if let Err(e) = self
                .optimizer
                .keep_grads_flat(crate::engine::gpu::cuda::set_grad)
            {
                eprintln!("dflash-top: note: gradients gathered each step ({e:#})");
            }
        }
        Ok(())
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
        let prepared = self.prepare_inputs(hidden, b, per_row, probe);
        probe.mark(Phase::Forward);
        let (fwd, graphed_step) = self.forward_step(&prepared);
        // An alias without autograd history: what the probe does to it in place reaches the loss
        // and never the graph that backward runs through.
        probe.after_forward(&mut fwd.out.detach())?;
        probe.mark(Phase::Loss);
        let (loss, grad) = self.loss(&fwd, &prepared.keep);
        probe.in_loss(&loss.loss)?;
        probe.mark(Phase::Backward);
        if graphed_step {
            self.graphs.backward(&grad)?;
        } else {
            backward_from(&fwd.out, &grad)?;
        }
        let (grad_norm, finite) = self.update(&loss.loss, lr, probe)?;
        probe.mark(Phase::Metrics);
        self.read_back(&loss, &fwd, &prepared.inputs, &grad_norm, &finite)
    }

    /// The step's inputs on the device, the rows whose labels count, and the window plan; the
    /// anchors padded to the width of a captured graph when one can run.
    fn prepare_inputs(
        &mut self,
        hidden: &Tensor,
        b: &PackedBatch,
        per_row: &[Vec<i64>],
        probe: &dyn StepProbe,
    ) -> Prepared {
        let (device, block) = (self.device, self.spec.block_size);
        // Padded to a whole number of attention tiles: few distinct shapes, full tiles.
        let width = crate::engine::model::tiled::padded_width(
            per_row.iter().map(Vec::len).max().unwrap_or(0),
        );
        let usable = device.is_cuda() && probe.own_stream() && !self.replicas.syncs();
        let graph_width = self
            .graphs
            .graph_width((usable, device), b.rows, b.seq, width);
        let width = graph_width.unwrap_or(width);
        let inputs = StepInputs {
            hidden: hidden.shallow_clone(),
            ids: b.input_ids.shallow_clone(),
            pos: b.positions.shallow_clone(),
            docs: b.doc_ids.shallow_clone(),
            loss_mask: b.loss_mask.shallow_clone(),
            anchors: anchors_tensor(per_row, width, device),
        };
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
        let plan = window_plan(per_row, width, &b.host_doc_ids, b.seq);
        Prepared {
            inputs,
            keep,
            plan,
            graphable: graph_width.is_some(),
        }
    }

    /// The forward, through the CUDA graph where one can run, else eagerly; and whether it ran
    /// through the graph.
    fn forward_step(&mut self, p: &Prepared) -> (Forwarded, bool) {
        // A lone replica's weight gradients go into their `.grad` inside backward's GEMMs where
        // those are views of the flat buffer (on a GPU, from the first step: `prepare`), zeroed
        // after each update; replicas' are hooked as autograd accumulates them. (On the CPU the
        // `.grad` exist from the second step only: a resumed run would take the op a step later
        // than one run in one go, and round differently.)
        let lone = !self.replicas.syncs() && self.optimizer.grads_are_flat();
        let planned = |x: &StepInputs, plan: &WindowPlan| {
            let run = || forward(&self.model, &self.embed, &self.spec, x, plan);
            if lone {
                crate::engine::gpu::cuda::with_gemm_grads(run)
            } else {
                run()
            }
        };
        // A failed capture falls back to this eager forward (and says why in `bench`).
        let graphed = if p.graphable {
            let graphed = self.graphs.forward(&p.inputs, &p.plan, planned);
            graphed.ok().flatten()
        } else {
            None
        };
        let graphed_step = graphed.is_some();
        let fwd = graphed.unwrap_or_else(|| planned(&p.inputs, &p.plan));
        (fwd, graphed_step)
    }

    /// The loss on the rows of `keep`, and its gradient with respect to the drafter's output.
    fn loss(&self, fwd: &Forwarded, keep: &Tensor) -> (LossOut, Tensor) {
        let block = self.spec.block_size;
        chunked_loss_rows(
            &fwd.out,
            &self.lm_head,
            &fwd.labels,
            &fwd.valid,
            keep,
            &slot_weights(block, gamma_for(block)),
            chunk_rows(self.spec.layers.vocab_size, self.loss_chunk_mib),
        )
    }

    /// After backward: the gradients averaged over the replicas, clipped, and the update applied
    /// where the loss and the gradients are finite. Returns the gradients' norm and whether they
    /// were finite, both on the device.
    fn update(
        &mut self,
        loss: &Tensor,
        lr: f64,
        probe: &mut dyn StepProbe,
    ) -> Result<(Tensor, Tensor)> {
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
            loss.isfinite().logical_and(&grad_norm.isfinite())
        };
        self.optimizer.step_if(lr, &finite);
        Ok((grad_norm, finite))
    }

    /// The step's figures read back in one transfer; a step found not finite is taken back.
    fn read_back(
        &mut self,
        loss: &LossOut,
        fwd: &Forwarded,
        inputs: &StepInputs,
        grad_norm: &Tensor,
        finite: &Tensor,
    ) -> Result<StepOutcome> {
        let (acc, tau) = block_metrics(&loss.correct, &fwd.valid, &inputs.anchors.valid);
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
        let host: Vec<f32> = crate::engine::gpu::host_sync::read(&packed)?; // the one transfer
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

/// A step's inputs, ready for the forward.
struct Prepared {
    inputs: StepInputs,
    /// The rows whose labels count in the loss.
    keep: Tensor,
    plan: WindowPlan,
    /// Whether a captured graph can run the forward (its anchors padded to the graph's width).
    graphable: bool,
}

/// The drafter's forward on `x`: block tokens, positions, labels and mask from the anchors, then
/// the drafter, its attention in the runs of tiles and context windows of `plan` (the batch's
/// own, or one that covers it).
fn forward(
    model: &Drafter,
    embed: &Tensor,
    spec: &DrafterSpec,
    x: &StepInputs,
    plan: &WindowPlan,
) -> Forwarded {
    let block = spec.block_size;
    let block_ids = block_input_ids(&x.ids, &x.anchors, block, spec.mask_token_id);
    let block_pos = block_positions(&x.pos, &x.anchors, block);
    let mask = AttnMask::Tiled(planned_block_mask(&x.docs, &x.anchors, block, plan));
    let (labels, valid) = block_labels(&x.ids, &x.docs, &x.loss_mask, &x.anchors, block);
    let block_emb = Tensor::embedding(embed, &block_ids, -1, false, false).to_kind(x.hidden.kind());
    let out = model.forward_masked(&x.hidden, &x.pos, &block_emb, &block_pos, &mask);
    Forwarded { out, labels, valid }
}

#[cfg(test)]
mod tests;
