//! A batch's anchors for the drafter's worker: each row's drawn from its documents and loss mask,
//! and shared out over the optimizer steps a batch trains (`--steps-per-batch`: a count, or a
//! step a document).

use crate::engine::data::{PackedBatch, Rng};
use crate::engine::train::blocks::{sample_anchors, AnchorScope};

/// Each row's anchors, drawn from its documents and loss mask.
pub(in crate::engine) fn anchors_by_row(
    b: &PackedBatch,
    anchors: i64,
    scope: AnchorScope,
    rng: &mut Rng,
) -> Vec<Vec<i64>> {
    let seq = b.seq as usize;
    (0..b.rows as usize)
        .map(|r| {
            let span = r * seq..(r + 1) * seq;
            sample_anchors(
                &b.host_doc_ids[span.clone()],
                &b.host_loss_mask[span],
                anchors as usize,
                scope,
                rng,
            )
        })
        .collect()
}

/// Each row's anchors shared out over `steps` optimizer steps: step j takes every `steps`-th
/// anchor from the j-th on (each part stays sorted and spread over the row). Fewer steps where
/// no row has that many anchors, so that no step is left with none; one step at least.
pub(in crate::engine) fn share_anchors(per_row: &[Vec<i64>], steps: i64) -> Vec<Vec<Vec<i64>>> {
    let most = per_row.iter().map(Vec::len).max().unwrap_or(0);
    let steps = (steps.max(1) as usize).min(most.max(1));
    (0..steps)
        .map(|j| {
            per_row
                .iter()
                .map(|a| a.iter().skip(j).step_by(steps).copied().collect())
                .collect()
        })
        .collect()
}

/// A step for each document of the batch (`--steps-per-batch doc`): step j takes one document's
/// anchors in its row, the other rows none; documents in row order, then in the row. Documents
/// without anchors take no step; one step at least (then with no anchors: a skipped batch).
pub(in crate::engine) fn share_by_doc(b: &PackedBatch, per_row: &[Vec<i64>]) -> Vec<Vec<Vec<i64>>> {
    let seq = b.seq as usize;
    let mut parts = Vec::new();
    for (r, anchors) in per_row.iter().enumerate() {
        let doc_of = |p: i64| b.host_doc_ids[r * seq + p as usize];
        let mut rest = &anchors[..];
        while let Some(&first) = rest.first() {
            let n = rest
                .iter()
                .take_while(|&&p| doc_of(p) == doc_of(first))
                .count();
            let mut part = vec![Vec::new(); per_row.len()];
            part[r] = rest[..n].to_vec();
            parts.push(part);
            rest = &rest[n..];
        }
    }
    if parts.is_empty() {
        parts.push(per_row.to_vec());
    }
    parts
}

/// Tokens of the documents a step's anchors are in: a step a document, that document's length.
pub(in crate::engine) fn doc_tokens_of(b: &PackedBatch, part: &[Vec<i64>]) -> u64 {
    let seq = b.seq as usize;
    let mut total = 0;
    for (r, anchors) in part.iter().enumerate() {
        let row = &b.host_doc_ids[r * seq..(r + 1) * seq];
        let mut docs: Vec<i64> = anchors.iter().map(|&p| row[p as usize]).collect();
        docs.dedup();
        total += row.iter().filter(|d| docs.contains(d)).count() as u64;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::{doc_tokens_of, share_anchors, share_by_doc};
    use crate::engine::data::PackedBatch;
    use tch::Tensor;

    fn batch(doc_ids: Vec<i64>, seq: i64) -> PackedBatch {
        let rows = doc_ids.len() as i64 / seq;
        PackedBatch {
            rows,
            seq,
            input_ids: Tensor::zeros([rows, seq], tch::kind::INT64_CPU),
            positions: Tensor::zeros([rows, seq], tch::kind::INT64_CPU),
            doc_ids: Tensor::zeros([rows, seq], tch::kind::INT64_CPU),
            loss_mask: Tensor::zeros([rows, seq], (tch::Kind::Bool, tch::Device::Cpu)),
            host_loss_mask: vec![true; doc_ids.len()],
            host_doc_ids: doc_ids,
            docs_placed: 0,
            truncated: 0,
            doc_tokens: 0,
        }
    }

    #[test]
    fn a_step_a_document_takes_each_documents_anchors_in_its_row() {
        // Row 0: documents 0 (positions 0-3) and 1 (4-7); row 1: document 2, then padding (3).
        let b = batch(vec![0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3], 8);
        let per_row = vec![vec![1, 2, 5], vec![0, 3, 4]];
        let parts = share_by_doc(&b, &per_row);
        assert_eq!(
            parts,
            vec![
                vec![vec![1, 2], vec![]],
                vec![vec![5], vec![]],
                vec![vec![], vec![0, 3, 4]],
            ]
        );
        // Each step counts its own document's tokens: 4, 4 and 6 (the padding is no document).
        let counted: Vec<u64> = parts.iter().map(|p| doc_tokens_of(&b, p)).collect();
        assert_eq!(counted, vec![4, 4, 6]);
        // Nothing to train: one step with no anchors, which the worker skips.
        let none: Vec<Vec<i64>> = vec![vec![], vec![]];
        assert_eq!(share_by_doc(&b, &none), vec![none.clone()]);
    }

    #[test]
    fn a_batch_anchors_are_shared_out_over_its_steps_each_once() {
        let per_row = vec![vec![1, 4, 9, 12, 20, 31, 40], vec![], vec![3, 5]];
        let parts = share_anchors(&per_row, 3);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0], vec![vec![1, 12, 40], vec![], vec![3]]);
        assert_eq!(parts[1], vec![vec![4, 20], vec![], vec![5]]);
        assert_eq!(parts[2], vec![vec![9, 31], vec![], vec![]]);
        // Each row's anchors, every one once, in the steps together.
        for (r, want) in per_row.iter().enumerate() {
            let mut got: Vec<i64> = parts.iter().flat_map(|p| p[r].clone()).collect();
            got.sort();
            assert_eq!(&got, want);
        }
        // No step without anchors: fewer steps where the rows hold fewer anchors.
        assert_eq!(share_anchors(&per_row, 10).len(), 7);
        assert_eq!(share_anchors(&[vec![], vec![]], 4).len(), 1);
        assert_eq!(share_anchors(&per_row, 1), vec![per_row.clone()]);
    }
}
