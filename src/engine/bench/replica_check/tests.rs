//! Tests of the replica check (src/engine/bench/replica_check.rs): the report's loss gap.

use super::*;

#[test]
fn the_gap_is_the_worst_step_relative_to_the_single_drafter() {
    let report = ReplicaReport {
        losses: vec![(12.0, 12.0), (11.0, 10.0), (9.9, 10.0)],
        replica_diff: 0.0,
        single_diff: 0.0,
    };
    assert!(
        (report.step_gap() - 0.1).abs() < 1e-6,
        "{}",
        report.step_gap()
    );
}
