//! The target's forward as one CUDA graph. Its shapes are fixed (rows x seq tokens), so the
//! forward is captured once on the worker's stream and replayed per batch: one launch instead of
//! about 25 per layer, which is what bounds the small targets (0.6B) on the host. The documents
//! vary per batch; the flash kernel takes them as data (`cu_seqlens`, padded with empty
//! documents to a fixed count), so one graph serves every batch up to `SEGMENTS_PER_ROW`
//! documents a row. Other batches, and builds or devices without the CUDA shim, run eagerly.
//! `TargetForward` is the choice a target worker makes per batch.

use super::cuda::{CaptureState, Graph};
use super::data::PackedBatch;
use super::qwen3::Qwen3Target;
use super::varlen::{cu_seqlens, Varlen};
use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

/// Documents a row the graph has room for (a row of more runs eagerly).
pub const SEGMENTS_PER_ROW: i64 = 64;

/// How the target forwards ran in this process.
static STATE: CaptureState = CaptureState::untried();

/// "graph", "eager (capture failed)" or "eager" (see `CaptureState`).
pub fn state() -> &'static str {
    STATE.describe()
}

pub struct TargetGraph {
    graph: Graph,
    ids: Tensor,
    positions: Tensor,
    cu: Tensor,
    out: Tensor,
    rows: i64,
    seq: i64,
}

impl TargetGraph {
    /// Captures the flash forward for batches of `rows` x `seq` on the calling thread's current
    /// stream (after two eager warm-up runs, which load the kernels and cuBLAS's workspace).
    pub fn capture(model: &Qwen3Target, rows: i64, seq: i64, device: Device) -> Result<Self> {
        let result = Self::build(model, rows, seq, device);
        STATE.record(result.is_ok());
        result
    }

    fn build(model: &Qwen3Target, rows: i64, seq: i64, device: Device) -> Result<Self> {
        let ids = Tensor::zeros([rows, seq], (Kind::Int64, device));
        let positions = Tensor::arange(seq, (Kind::Int64, device))
            .unsqueeze(0)
            .repeat([rows, 1]);
        let slots = (rows * SEGMENTS_PER_ROW) as usize;
        let one_doc_a_row: Vec<i64> = (0..rows).flat_map(|r| vec![r; seq as usize]).collect();
        let cu = padded(&one_doc_a_row, seq as usize, slots).context("a row is one document")?;
        let cu = Tensor::from_slice(&cu).to_device(device);
        let docs = Varlen {
            cu_seqlens: cu.shallow_clone(),
            max_len: seq,
        };
        for _ in 0..2 {
            let _ = model.forward_documents(&ids, &positions, &docs);
        }
        let (graph, out) =
            Graph::capture(device, || model.forward_documents(&ids, &positions, &docs))?;
        Ok(TargetGraph {
            graph,
            ids,
            positions,
            cu,
            out,
            rows,
            seq,
        })
    }

    /// The hidden states of batch `b` (on the graph's device) through the captured forward, in
    /// a tensor of their own; `None` when the batch does not fit the graph (shape, documents).
    pub fn run(&self, b: &PackedBatch) -> Result<Option<Tensor>> {
        if (b.rows, b.seq) != (self.rows, self.seq) {
            return Ok(None);
        }
        let slots = (self.rows * SEGMENTS_PER_ROW) as usize;
        let Some(cu) = padded(&b.host_doc_ids, b.seq as usize, slots) else {
            return Ok(None);
        };
        let mut ids = self.ids.shallow_clone();
        let mut positions = self.positions.shallow_clone();
        let mut cu_dev = self.cu.shallow_clone();
        ids.copy_(&b.input_ids);
        positions.copy_(&b.positions);
        cu_dev.copy_(&Tensor::from_slice(&cu));
        self.graph.replay()?;
        Ok(Some(self.out.copy()))
    }
}

/// How a target worker runs its forward: the CUDA graph where it was captured (at the first
/// batch, on the worker's own stream), else the eager flash forward where `Varlen::usable`, else
/// the dense-mask forward.
pub struct TargetForward {
    flash: bool,
    /// `None` until the first batch; `Some(None)` when no graph is used (not wanted, no stream
    /// of its own, or a failed capture).
    graph: Option<Option<TargetGraph>>,
    device: Device,
}

impl TargetForward {
    pub fn new(model: &Qwen3Target, device: Device) -> TargetForward {
        TargetForward {
            flash: Varlen::usable(device, model.embed_tokens.kind(), model.cfg.head_dim),
            graph: None,
            device,
        }
    }

    /// The captured layers' hidden states of batch `b` (on this worker's device);
    /// `own_stream`: whether the worker runs on a stream of its own (graphs need one).
    pub fn run(
        &mut self,
        model: &Qwen3Target,
        b: &PackedBatch,
        own_stream: bool,
    ) -> Result<Tensor> {
        if self.flash && self.graph.is_none() {
            let capture = super::cuda::graphs_wanted() && own_stream;
            self.graph = Some(
                capture
                    .then(|| TargetGraph::capture(model, b.rows, b.seq, self.device).ok())
                    .flatten(),
            );
        }
        if let Some(g) = self.graph.as_ref().and_then(Option::as_ref) {
            if let Some(hidden) = g.run(b)? {
                return Ok(hidden);
            }
        }
        Ok(if self.flash {
            let docs = Varlen::from_doc_ids(&b.host_doc_ids, b.seq as usize, self.device);
            model.forward_documents(&b.input_ids, &b.positions, &docs)
        } else {
            model.forward(&b.input_ids, &b.positions, &b.doc_ids)
        })
    }
}

/// `cu_seqlens` of the batch padded with empty documents to `slots` documents, or `None` when it
/// has more.
fn padded(doc_ids: &[i64], seq: usize, slots: usize) -> Option<Vec<i32>> {
    let (mut cu, _) = cu_seqlens(doc_ids, seq);
    if cu.len() > slots + 1 {
        return None;
    }
    let total = *cu.last().unwrap_or(&0);
    cu.resize(slots + 1, total);
    Some(cu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_padded_with_empty_ones_up_to_the_slots() {
        // Two rows of 4: documents of 3 and 1, then 4.
        let ids = [0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(padded(&ids, 4, 5), Some(vec![0, 3, 4, 8, 8, 8]));
        assert_eq!(padded(&ids, 4, 3), Some(vec![0, 3, 4, 8]));
        assert_eq!(
            padded(&ids, 4, 2),
            None,
            "three documents do not fit two slots"
        );
    }
}
