//! The loss: position-decayed cross-entropy over the block slots, computed through the frozen
//! lm head in chunks so that 512 anchors x 16 slots x a 151936 vocabulary never exist as one
//! logits tensor, and the metrics read back in one transfer.

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

/// Weighted cross-entropy, normalised by the sum of the weights that count; runs the backward
/// through the lm head chunk by chunk, then once through the drafter. A batch with no label
/// that counts gives loss 0 and zero gradients, never NaN.
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
    chunked_loss_backward_rows(hidden, lm_head, labels, valid, &keep, weights, chunk_rows)
}

/// `chunked_loss_backward` over the rows `keep` (int64, the flat indices where `valid` is true,
/// as `label_rows` computes them on the host): no host sync.
pub fn chunked_loss_backward_rows(
    hidden: &Tensor,
    lm_head: &Tensor,
    labels: &Tensor,
    valid: &Tensor,
    keep: &Tensor,
    weights: &[f32],
    chunk_rows: i64,
) -> (LossOut, impl FnOnce()) {
    let (b, a, block) = (labels.size()[0], labels.size()[1], labels.size()[2]);
    let h = hidden.size()[2];
    let dev = hidden.device();
    let detached = hidden.detach().set_requires_grad(true);
    let rows = detached.view([b * a * block, h]);
    let w = Tensor::from_slice(weights)
        .to_device(dev)
        .view([1, 1, block]);
    let row_w = (valid.to_kind(Kind::Float) * w).view([-1]);
    let denom = row_w.sum(Kind::Float).clamp_min(1e-12);
    let flat_labels = labels.view([-1]);
    // Only rows that count go through the lm head.
    let n = keep.size()[0];
    let head = lm_head.detach();
    let mut loss = Tensor::zeros([], (Kind::Float, dev));
    let mut hits = Vec::new();
    let mut start = 0;
    while start < n {
        let len = chunk_rows.min(n - start);
        let idx = keep.narrow(0, start, len);
        let x = rows.index_select(0, &idx);
        // Logits in the compute dtype; log_softmax reads them and writes fp32 in one pass.
        let logits = x.matmul(&head.to_kind(x.kind()).tr());
        let y = flat_labels.index_select(0, &idx);
        let logp = logits.log_softmax(-1, Kind::Float);
        let nll = logp.gather(1, &y.unsqueeze(1), false).squeeze_dim(1).neg();
        let part = (nll * row_w.index_select(0, &idx)).sum(Kind::Float) / &denom;
        part.backward();
        loss += part.detach();
        hits.push((idx, logits.argmax(-1, false).eq_tensor(&y)));
        start += len;
    }
    let mut correct = Tensor::zeros([b * a * block], (Kind::Bool, dev));
    for (idx, hit) in hits {
        let _ = correct.index_put_(&[Some(idx)], &hit, false);
    }
    let correct = correct.view([b, a, block]);
    let grad = detached.grad();
    let hidden = hidden.shallow_clone();
    let backward = move || {
        if grad.defined() {
            (hidden * grad.detach()).sum(Kind::Float).backward();
        }
    };
    (LossOut { loss, correct }, backward)
}

/// Per-slot accuracy and tau. tau = 1 + the mean over valid blocks of the run of consecutive
/// correct slots from slot 1.
// correct, valid [b, a, block]; anchor_valid [b, a] -> (acc [block] f32, tau scalar f32)
pub fn block_metrics(correct: &Tensor, valid: &Tensor, anchor_valid: &Tensor) -> (Tensor, Tensor) {
    let block = correct.size()[2];
    let hit = correct.logical_and(valid).to_kind(Kind::Float);
    let counted = valid
        .to_kind(Kind::Float)
        .sum_dim_intlist(&[0i64, 1][..], false, Kind::Float);
    let acc = hit.sum_dim_intlist(&[0i64, 1][..], false, Kind::Float) / counted.clamp_min(1.0);
    let run = hit
        .narrow(2, 1, block - 1)
        .cumprod(2, Kind::Float)
        .sum_dim_intlist(&[2i64][..], false, Kind::Float);
    let av = anchor_valid.to_kind(Kind::Float);
    let blocks = av.sum(Kind::Float).clamp_min(1.0);
    let tau = (run * &av).sum(Kind::Float) / blocks + 1.0;
    (acc, tau)
}
