//! Tests of the phase recorder (src/telemetry/phase_recorder.rs): what a step's metrics read from old and new frames.

use super::TrainMetrics;

#[test]
fn numbers_left_out_are_absent_and_old_frames_read_as_before() {
    let m: TrainMetrics = serde_json::from_str(r#"{"loss":2.5,"step":3}"#).unwrap();
    assert_eq!(
        (m.loss, m.tau, m.lr, m.grad_norm),
        (Some(2.5), None, None, None)
    );
    assert_eq!(m.step, 3);
    let old = r#"{"loss":2.5,"tau":1.5,"lr":0.001,"grad_norm":0.5,"step":3}"#;
    let m: TrainMetrics = serde_json::from_str(old).unwrap();
    assert_eq!(
        (m.tau, m.lr, m.grad_norm),
        (Some(1.5), Some(0.001), Some(0.5))
    );
    let back = serde_json::to_string(&TrainMetrics {
        loss: Some(1.0),
        ..Default::default()
    })
    .unwrap();
    assert!(
        !back.contains("tau") && back.contains("\"loss\":1.0"),
        "{back}"
    );
}
