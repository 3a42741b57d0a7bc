//! A batch's anchors for the drafter's worker: each row's drawn from its documents and loss mask,
//! and shared out over the optimizer steps a batch trains (`--steps-per-batch`).

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

#[cfg(test)]
mod tests {
    use super::share_anchors;

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
