//! The target's forward as CUDA graphs. Its shapes are fixed (rows x seq tokens), so the
//! forward is captured on the worker's stream and replayed per batch: one launch instead of
//! about 25 per layer, which is what bounds the small targets (0.6B) on the host. The documents
//! vary per batch; the flash kernel takes them as data (`cu_seqlens`, padded with empty
//! documents to a fixed count). The kernel's grid is documents x the longest document's blocks x
//! heads, and an empty document's blocks still launch: padding every batch to 64 documents a row
//! made the attention launch some 50,000 blocks a layer at 8B, almost all of them empty. So
//! graphs are kept per document count, in powers of two from `MIN_SLOTS` up to
//! `SEGMENTS_PER_ROW` a row, captured as batches need them, all in one memory pool (one
//! replays at a time and its output is copied out before the next). Batches of more documents,
//! and builds or devices without the CUDA shim, run eagerly. `TargetForward` is the choice a
//! target worker makes per batch.

use super::qwen3::Qwen3Target;
use super::varlen::{cu_seqlens, Varlen};
use crate::engine::data::PackedBatch;
use crate::engine::gpu::cuda::{upload, Graph};
use crate::engine::gpu::fast_paths::PathState;
use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

/// Documents a row the graph has room for (a row of more runs eagerly).
pub const SEGMENTS_PER_ROW: i64 = 64;

/// How the target forwards ran in this process.
static STATE: PathState = PathState::untried();

/// "graph", "eager (failed: …)" or "eager" (see `PathState`).
pub fn state() -> String {
    STATE.describe("graph", "eager")
}

/// Fewest document slots a graph has.
const MIN_SLOTS: usize = 4;

pub struct TargetGraph {
    graph: Graph,
    ids: Tensor,
    positions: Tensor,
    cu: Tensor,
    out: Tensor,
    rows: i64,
    seq: i64,
    /// Documents the graph has room for (all rows together).
    slots: usize,
}

impl TargetGraph {
    /// Captures the flash forward for batches of `rows` x `seq` tokens and up to `slots`
    /// documents on the calling thread's current stream, in the memory pool of `share` when
    /// given; the first capture runs the forward eagerly twice before (kernels loaded, cuBLAS's
    /// workspace allocated). Recorded in `state()`.
    fn capture(
        model: &Qwen3Target,
        (rows, seq, slots): (i64, i64, usize),
        device: Device,
        share: Option<&TargetGraph>,
    ) -> Result<Self> {
        let ids = Tensor::zeros([rows, seq], (Kind::Int64, device));
        let positions = Tensor::arange(seq, (Kind::Int64, device))
            .unsqueeze(0)
            .repeat([rows, 1]);
        let one_doc_a_row: Vec<i64> = (0..rows).flat_map(|r| vec![r; seq as usize]).collect();
        let (one_a_row, _) = cu_seqlens(&one_doc_a_row, seq as usize);
        let cu = padded(&one_a_row, slots).context("a row is one document")?;
        let cu = Tensor::from_slice(&cu).to_device(device);
        let docs = Varlen {
            cu_seqlens: cu.shallow_clone(),
            max_len: seq,
        };
        if share.is_none() {
            for _ in 0..2 {
                let _ = model.forward_documents(&ids, &positions, &docs);
            }
        }
        let (graph, out) = Graph::capture(device, share.map(|g| &g.graph), || {
            model.forward_documents(&ids, &positions, &docs)
        })?;
        STATE.ran();
        Ok(TargetGraph {
            graph,
            ids,
            positions,
            cu,
            out,
            rows,
            seq,
            slots,
        })
    }

    /// The hidden states of batch `b` (on the graph's device, `cu` its documents' `cu_seqlens`)
    /// through the captured forward, in a tensor of their own; `None` when the batch does not
    /// fit the graph (shape, documents).
    pub fn run(&self, b: &PackedBatch, cu: &[i32]) -> Result<Option<Tensor>> {
        if (b.rows, b.seq) != (self.rows, self.seq) {
            return Ok(None);
        }
        let Some(cu) = padded(cu, self.slots) else {
            return Ok(None);
        };
        let mut ids = self.ids.shallow_clone();
        let mut positions = self.positions.shallow_clone();
        let mut cu_dev = self.cu.shallow_clone();
        ids.copy_(&b.input_ids);
        positions.copy_(&b.positions);
        cu_dev.copy_(&upload(&Tensor::from_slice(&cu), self.cu.device()));
        self.graph.replay()?;
        Ok(Some(self.out.copy()))
    }
}

/// The document slots of the graph for a batch of `docs` documents in `rows` rows: the next
/// power of two from `MIN_SLOTS`; `None` beyond `SEGMENTS_PER_ROW` a row.
fn slots_for(docs: usize, rows: i64) -> Option<usize> {
    let most = rows.max(1) as usize * SEGMENTS_PER_ROW as usize;
    (docs <= most).then(|| docs.max(MIN_SLOTS).next_power_of_two().min(most))
}

/// How a target worker runs its forward: a CUDA graph for the batch's document count where one
/// is captured or can be (on the worker's own stream), else the eager flash forward where
/// `Varlen::usable`, else the dense-mask forward.
pub struct TargetForward {
    flash: bool,
    /// Captured graphs, by document slots (one batch shape: the first batch's).
    graphs: Vec<TargetGraph>,
    /// No more captures: not wanted, no stream of its own, or a capture failed.
    no_more: bool,
    device: Device,
}

impl TargetForward {
    pub fn new(model: &Qwen3Target, device: Device) -> TargetForward {
        TargetForward {
            flash: Varlen::usable(device, model.embed_tokens.kind(), model.cfg.head_dim),
            graphs: Vec::new(),
            no_more: false,
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
        if !self.flash {
            return Ok(model.forward(&b.input_ids, &b.positions, &b.doc_ids));
        }
        let (cu, max_len) = cu_seqlens(&b.host_doc_ids, b.seq as usize);
        if let Some(hidden) = self.graphed(model, b, &cu, own_stream)? {
            return Ok(hidden);
        }
        let docs = Varlen::from_cu(&cu, max_len, self.device);
        Ok(model.forward_documents(&b.input_ids, &b.positions, &docs))
    }

    /// `b` (its documents' `cu_seqlens` `cu`) through the graph of its document count, captured
    /// first where needed; `None` where no graph serves it.
    fn graphed(
        &mut self,
        model: &Qwen3Target,
        b: &PackedBatch,
        cu: &[i32],
        own_stream: bool,
    ) -> Result<Option<Tensor>> {
        let docs = cu.len() - 1;
        let Some(slots) = slots_for(docs, b.rows) else {
            return Ok(None);
        };
        let first_shape = self.graphs.first().map(|g| (g.rows, g.seq));
        if first_shape.is_some_and(|shape| shape != (b.rows, b.seq)) {
            return Ok(None);
        }
        if !self.graphs.iter().any(|g| g.slots == slots) && !self.no_more {
            let wanted = crate::engine::gpu::cuda::graphs_wanted() && own_stream;
            let key = (b.rows, b.seq, slots);
            match wanted.then(|| TargetGraph::capture(model, key, self.device, self.graphs.first()))
            {
                Some(Ok(graph)) => self.graphs.push(graph),
                Some(Err(e)) => {
                    // The graphs captured before keep serving their document counts.
                    STATE.failed_once(&e);
                    self.no_more = true;
                }
                None => self.no_more = true,
            }
        }
        match self.graphs.iter().find(|g| g.slots == slots) {
            Some(g) => g.run(b, cu),
            None => Ok(None),
        }
    }
}

/// A batch's `cu_seqlens` padded with empty documents to `slots` documents, or `None` when it
/// has more.
fn padded(cu: &[i32], slots: usize) -> Option<Vec<i32>> {
    if cu.len() > slots + 1 {
        return None;
    }
    let mut cu = cu.to_vec();
    let total = *cu.last().unwrap_or(&0);
    cu.resize(slots + 1, total);
    Some(cu)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch of `rows` rows of `seq` tokens, each row cut into `docs` equal documents.
    fn batch(rows: i64, seq: i64, docs: i64, device: Device) -> PackedBatch {
        let len = seq / docs;
        let doc_of = |i: i64| (i / len).min(docs - 1);
        let host_doc_ids: Vec<i64> = (0..rows * seq).map(|i| doc_of(i % seq)).collect();
        let pos: Vec<i64> = (0..rows * seq)
            .map(|i| i % seq - doc_of(i % seq) * len)
            .collect();
        let shape = [rows, seq];
        PackedBatch {
            rows,
            seq,
            input_ids: Tensor::randint(500, shape, (Kind::Int64, device)),
            positions: Tensor::from_slice(&pos).view(shape).to_device(device),
            doc_ids: Tensor::from_slice(&host_doc_ids)
                .view(shape)
                .to_device(device),
            loss_mask: Tensor::ones(shape, (Kind::Bool, device)),
            host_loss_mask: vec![true; (rows * seq) as usize],
            host_doc_ids,
            docs_placed: 0,
            truncated: 0,
            doc_tokens: 0,
        }
    }

    /// Batches of 2, 5 and 1 documents a row go through graphs of 4, 16 and 4 slots (two
    /// captured) and give the eager flash forward's hidden states. Skipped without a GPU and
    /// the CUDA shim.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn graphs_by_document_count_give_the_eager_forward_on_cuda() {
        if crate::engine::gpu::cuda::cuda_or_skip("the target's CUDA graphs").is_none() {
            return;
        }
        let device = Device::Cuda(tch::Cuda::device_count() as usize - 1);
        let _stream = crate::engine::gpu::cuda::Stream::own(device).unwrap();
        let p = crate::engine::train::presets::Preset::by_name("tiny").unwrap();
        let spec = p.drafter_spec(&p.target);
        let mut vs = tch::nn::VarStore::new(device);
        let mut model = Qwen3Target::new(&vs.root(), &p.target, &spec.target_layer_ids, 0.5);
        vs.freeze();
        vs.set_kind(Kind::BFloat16);
        model.fuse_projections();
        let mut forward = TargetForward::new(&model, device);
        assert!(
            forward.flash,
            "the tiny target in bf16 takes the flash path"
        );
        for docs in [2, 5, 1] {
            let b = batch(2, 256, docs, device);
            let graphed = forward.run(&model, &b, true).unwrap();
            let eager = tch::no_grad(|| {
                let docs = Varlen::from_doc_ids(&b.host_doc_ids, 256, device);
                model.forward_documents(&b.input_ids, &b.positions, &docs)
            });
            let gap = f64::try_from((&graphed - &eager).abs().max().to_kind(Kind::Float)).unwrap();
            let scale = f64::try_from(eager.abs().max().to_kind(Kind::Float)).unwrap();
            assert!(
                gap <= 1e-2 * scale,
                "{docs} documents a row: apart by {gap} of {scale}"
            );
        }
        let slots: Vec<usize> = forward.graphs.iter().map(|g| g.slots).collect();
        assert_eq!(slots, vec![4, 16]);
    }

    #[test]
    fn a_batch_gets_the_fewest_slots_that_hold_its_documents() {
        assert_eq!(slots_for(1, 1), Some(4));
        assert_eq!(slots_for(4, 1), Some(4));
        assert_eq!(slots_for(5, 1), Some(8));
        assert_eq!(slots_for(33, 1), Some(64));
        assert_eq!(slots_for(64, 1), Some(64));
        assert_eq!(
            slots_for(65, 1),
            None,
            "more than 64 documents a row run eagerly"
        );
        assert_eq!(slots_for(65, 2), Some(128));
    }

    #[test]
    fn documents_are_padded_with_empty_ones_up_to_the_slots() {
        // Two rows of 4: documents of 3 and 1, then 4.
        let (cu, _) = cu_seqlens(&[0, 0, 0, 1, 0, 0, 0, 0], 4);
        assert_eq!(padded(&cu, 5), Some(vec![0, 3, 4, 8, 8, 8]));
        assert_eq!(padded(&cu, 3), Some(vec![0, 3, 4, 8]));
        assert_eq!(padded(&cu, 2), None, "three documents do not fit two slots");
    }
}
