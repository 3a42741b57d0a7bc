//! The loss: position-decayed cross-entropy over the block slots, computed through the frozen
//! lm head in chunks so that 512 anchors x 16 slots x a 151936 vocabulary never exist as one
//! logits tensor, with each chunk's gradient written directly in the compute dtype (no autograd
//! graph and no f32 copy of the logits), and the metrics read back in one transfer.

use tch::{Kind, Tensor};

/// gamma of the slot weights for a block size (paper appendix A.1 / SpecForge defaults).
pub fn gamma_for(block: i64) -> f64 {
    match block {
        b if b <= 8 => 4.0,
        b if b <= 10 => 5.0,
        _ => 7.0,
    }
}

/// Slot weights: slot 0 none, slot k `exp(-(k-1)/gamma)`.
pub fn slot_weights(block: i64, gamma: f64) -> Vec<f32> {
    (0..block)
        .map(|k| {
            if k == 0 {
                0.0
            } else {
                (-((k - 1) as f64) / gamma).exp() as f32
            }
        })
        .collect()
}

/// What the loss phase leaves behind: the loss (detached) and per-slot correctness.
pub struct LossOut {
    /// scalar f32
    pub loss: Tensor,
    /// [b, a, block] bool: argmax == label where the label counts
    pub correct: Tensor,
}

/// Weighted cross-entropy, normalised by the sum of the weights that count; the gradient of
/// each lm-head chunk is written directly (see `chunk_loss_grad`), then one backward runs
/// through the drafter. A batch with no label that counts gives loss 0 and zero gradients, never
/// NaN.
// hidden [b, a*block, h] (with grad), lm_head [v, h], labels/valid [b, a, block]
pub fn chunked_loss_backward(
    hidden: &Tensor,
    lm_head: &Tensor,
    labels: &Tensor,
    valid: &Tensor,
    weights: &[f32],
    chunk_rows: i64,
) -> (LossOut, impl FnOnce()) {
    // Reading the count back waits for the device; the trainer passes the rows from the host.
    let keep = valid.view([-1]).nonzero().squeeze_dim(1);
    let (out, grad) = chunked_loss_rows(hidden, lm_head, labels, valid, &keep, weights, chunk_rows);
    let hidden = hidden.shallow_clone();
    (out, move || {
        backward_from(&hidden, &grad).expect("backward through the drafter")
    })
}

/// The loss over the rows `keep` (int64, the flat indices where `valid` is true, as `label_rows`
/// computes them on the host: no host sync) and its gradient with respect to `hidden`
/// ([b, a*block, h], in `hidden`'s dtype), nothing run backward yet (see `backward_from`).
pub fn chunked_loss_rows(
    hidden: &Tensor,
    lm_head: &Tensor,
    labels: &Tensor,
    valid: &Tensor,
    keep: &Tensor,
    weights: &[f32],
    chunk_rows: i64,
) -> (LossOut, Tensor) {
    let (b, a, block) = (labels.size()[0], labels.size()[1], labels.size()[2]);
    let h = hidden.size()[2];
    let dev = hidden.device();
    let kind = hidden.kind();
    let rows = hidden.detach().view([b * a * block, h]);
    // Queued, not waited for: the forward is still running (see `cuda::upload`).
    let w = crate::engine::gpu::cuda::upload(&Tensor::from_slice(weights), dev).view([1, 1, block]);
    let row_w = (valid.to_kind(Kind::Float) * w).view([-1]);
    let denom = row_w.sum(Kind::Float).clamp_min(1e-12);
    let flat_labels = labels.view([-1]);
    // Only rows that count go through the lm head; the head is frozen (no gradient of its own).
    let n = keep.size()[0];
    let head = lm_head.detach().to_kind(kind);
    let mut grad = Tensor::zeros([b * a * block, h], (kind, dev));
    let mut loss = Tensor::zeros([], (Kind::Float, dev));
    let mut correct = Tensor::zeros([b * a * block], (Kind::Bool, dev));
    // Chunks of equal size (a GEMM shape repeated, no small remainder), `chunk_rows` at most.
    let chunks = ((n + chunk_rows.max(1) - 1) / chunk_rows.max(1)).max(1);
    let even = (n + chunks - 1) / chunks;
    let mut start = 0;
    while start < n {
        let len = even.min(n - start);
        let idx = keep.narrow(0, start, len);
        let scale = row_w.index_select(0, &idx) / &denom;
        let part = chunk_loss_grad(
            &rows.index_select(0, &idx),
            &head,
            &flat_labels.index_select(0, &idx),
            &scale,
        );
        loss += part.loss;
        let _ = grad.index_copy_(0, &idx, &part.grad);
        let _ = correct.index_copy_(0, &idx, &part.hit);
        start += len;
    }
    let correct = correct.view([b, a, block]);
    (LossOut { loss, correct }, grad.view([b, a * block, h]))
}

/// Backward through the drafter from its output `hidden` with the loss's gradient `grad`. It
/// runs even when no row counts (zero gradients): replicas reduce their gradients from hooks
/// that backward fires, and every replica must fire them alike.
pub fn backward_from(hidden: &Tensor, grad: &Tensor) -> Result<(), tch::TchError> {
    if hidden.requires_grad() {
        (hidden * grad).sum(Kind::Float).f_backward()?;
    }
    Ok(())
}

/// One chunk's share of the loss, its gradient with respect to the rows, and the rows whose
/// argmax is the label.
struct ChunkLoss {
    /// scalar f32
    loss: Tensor,
    /// [n, h], in the rows' dtype
    grad: Tensor,
    /// [n] bool
    hit: Tensor,
}

/// Cross-entropy through a frozen head with the gradient written directly, in the rows' dtype:
/// logits, then softmax over them (accumulated in f32 inside the kernel), and the probabilities
/// become the logits' gradient in place, `p - onehot(label)`. Nothing of `n x vocab` is ever f32.
///
/// In bf16, `p_label - 1` would cancel: near 1 the spacing of bf16 is 2^-8, coarser than the
/// gradient itself once the drafter is confident. So the label's entry is written as minus the
/// sum of the other probabilities, summed in f32 (the row sum minus the label's own rounded
/// value: its rounding cancels exactly), and the loss of a confident row is `-log1p(-others)`.
// x [n, h], head [v, h], labels [n], scale [n] f32 (weight / denominator) -> ChunkLoss
fn chunk_loss_grad(x: &Tensor, head: &Tensor, labels: &Tensor, scale: &Tensor) -> ChunkLoss {
    let kind = x.kind();
    let mut logits = x.matmul(&head.tr());
    // One kernel where it runs (CUDA, bf16): the steps of `loss_rows_ops` in two passes.
    let (p, nll, hit) = match crate::engine::gpu::cuda::loss_rows(&mut logits, labels) {
        Some((nll, hit)) => (logits, nll, hit),
        None => loss_rows_ops(logits, labels),
    };
    let loss = (nll * scale).sum(Kind::Float);
    let grad = (p.matmul(head).to_kind(Kind::Float) * scale.unsqueeze(1)).to_kind(kind);
    ChunkLoss { loss, grad, hit }
}

/// `p - onehot(label)` of each row of `logits` [n, v] (in their dtype, the label's entry
/// written as minus the sum of the others), each row's negative log-likelihood [n] f32 and
/// whether its argmax is the label [n] bool.
fn loss_rows_ops(logits: Tensor, labels: &Tensor) -> (Tensor, Tensor, Tensor) {
    let hit = logits.argmax(-1, false).eq_tensor(labels);
    let mut p = logits.softmax(-1, logits.kind());
    drop(logits);
    let y = labels.unsqueeze(1);
    let total = p.sum_dim_intlist(&[-1i64][..], false, Kind::Float);
    let p_label = p.gather(1, &y, false).squeeze_dim(1).to_kind(Kind::Float);
    let others = (total - &p_label).clamp_min(0.0);
    let nll = p_label
        .clamp_min(f32::MIN_POSITIVE as f64)
        .log()
        .neg()
        .where_self(&p_label.lt(0.5), &others.neg().log1p().neg());
    let _ = p.scatter_(1, &y, &others.neg().to_kind(p.kind()).unsqueeze(1));
    (p, nll, hit)
}

/// Per-slot accuracy and tau. tau = 1 + the mean over valid blocks of the labelled slots
/// correct in a row from slot 1, SpecForge's accept length: a slot without a label (past the
/// document's end, outside the loss mask) neither breaks the run nor counts in it.
// correct, valid [b, a, block]; anchor_valid [b, a] -> (acc [block] f32, tau scalar f32)
pub fn block_metrics(correct: &Tensor, valid: &Tensor, anchor_valid: &Tensor) -> (Tensor, Tensor) {
    let block = correct.size()[2];
    let hit = correct.logical_and(valid).to_kind(Kind::Float);
    let counted = valid
        .to_kind(Kind::Float)
        .sum_dim_intlist(&[0i64, 1][..], false, Kind::Float);
    let acc = hit.sum_dim_intlist(&[0i64, 1][..], false, Kind::Float) / counted.clamp_min(1.0);
    let slots = |t: &Tensor| t.narrow(2, 1, block - 1);
    let unbroken = slots(&correct.logical_or(&valid.logical_not())).cumprod(2, Kind::Float);
    let run = (unbroken * slots(valid).to_kind(Kind::Float)).sum_dim_intlist(
        &[2i64][..],
        false,
        Kind::Float,
    );
    let av = anchor_valid.to_kind(Kind::Float);
    let blocks = av.sum(Kind::Float).clamp_min(1.0);
    let tau = (run * &av).sum(Kind::Float) / blocks + 1.0;
    (acc, tau)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loss kernel against the ops it replaces, on rows of random logits and rows where the
    /// label's probability is near 1 (the `-log1p(-others)` branch): the gradient rows within a
    /// bf16 step of each other, the label's entry included, the losses within f32 summation
    /// order, and the argmax hits equal where a row's largest logit is unique. A vocabulary not
    /// a multiple of a block's 8,192 elements a pass. Skipped without a GPU and the CUDA shim.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_loss_kernel_gives_the_ops_on_cuda() {
        let Some(dev) = crate::engine::gpu::cuda::cuda_or_skip("the loss kernel") else {
            return;
        };
        tch::manual_seed(14);
        let (rows, vocab) = (37, 10_000);
        let labels = Tensor::randint(vocab, [rows], (Kind::Int64, dev));
        let logits = Tensor::randn([rows, vocab], (Kind::Float, dev)) * 3.0;
        // The first 10 rows confident in their label, 3 of them in another token.
        let confident = Tensor::zeros([rows, vocab], (Kind::Float, dev)).scatter_value(
            1,
            &labels.unsqueeze(1),
            40.0,
        );
        let first = |t: &Tensor, n| t.narrow(0, 0, n);
        let _ = first(&logits, 10).g_add_(&first(&confident, 10));
        let _ = logits.narrow(0, 7, 3).narrow(1, 0, 1).fill_(80.0);
        let logits = logits.to_kind(Kind::BFloat16);
        let (p_ops, nll_ops, hit_ops) = loss_rows_ops(logits.copy(), &labels);
        let mut p_kernel = logits.copy();
        let (nll_kernel, hit_kernel) = crate::engine::gpu::cuda::loss_rows(&mut p_kernel, &labels)
            .unwrap_or_else(|| {
                panic!(
                    "did not run: {}",
                    crate::engine::gpu::cuda::drafter_kernels_state()
                )
            });
        let f = |t: &Tensor| t.to_kind(Kind::Float);
        let gap = f64::try_from((f(&p_kernel) - f(&p_ops)).abs().max()).unwrap();
        assert!(gap <= 1.0 / 256.0, "gradients apart by {gap}");
        let label_gap = (f(&p_kernel) - f(&p_ops))
            .gather(1, &labels.unsqueeze(1), false)
            .abs()
            .max();
        assert!(f64::try_from(label_gap).unwrap() <= 1.0 / 256.0);
        let nll_gap = f64::try_from((&nll_kernel - &nll_ops).abs().max()).unwrap();
        let nll_top = f64::try_from(nll_ops.abs().max()).unwrap();
        assert!(nll_gap <= 1e-3 * nll_top.max(1.0), "nll apart by {nll_gap}");
        // Rows confident in their own label: a small loss, and a hit.
        let small = f64::try_from(nll_ops.narrow(0, 0, 7).max()).unwrap();
        assert!(small < 1e-3, "{small}");
        let unique = f(&logits)
            .eq_tensor(&f(&logits).amax(&[1i64][..], true))
            .sum_dim_intlist(&[1i64][..], false, Kind::Int64)
            .eq(1);
        assert!(i64::try_from(unique.sum(Kind::Int64)).unwrap() > 30);
        assert!(hit_kernel
            .masked_select(&unique)
            .equal(&hit_ops.masked_select(&unique)));
        assert!(bool::try_from(hit_ops.narrow(0, 0, 7).all()).unwrap());
    }

    #[test]
    fn tau_runs_through_unlabelled_slots_without_counting_them() {
        let t = |v: &[bool]| Tensor::from_slice(v).view([1, 3, 5]);
        // Slot 0 is the anchor; a block's slots 1..4.
        let correct = t(&[
            false, true, true, false, true, // 2 in a row, then a miss
            false, true, false, true, true, // slot 2 unlabelled: 1 + 2
            false, true, true, true, true, // past the end after slot 2: 2
        ]);
        let valid = t(&[
            false, true, true, true, true, //
            false, true, false, true, true, //
            false, true, true, false, false, //
        ]);
        let anchors = Tensor::from_slice(&[true, true, true]).view([1, 3]);
        let (_, tau) = block_metrics(&correct, &valid, &anchors);
        let tau = f64::try_from(&tau).unwrap();
        assert!(
            (tau - (1.0 + (2.0 + 3.0 + 2.0) / 3.0)).abs() < 1e-6,
            "{tau}"
        );
        // An invalid block does not count.
        let one = Tensor::from_slice(&[true, false, false]).view([1, 3]);
        let (_, tau) = block_metrics(&correct, &valid, &one);
        assert!((f64::try_from(&tau).unwrap() - 3.0).abs() < 1e-6);
    }
}
