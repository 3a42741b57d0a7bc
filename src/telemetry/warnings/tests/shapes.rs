//! The `shapes_vary` rule: batch sizes that change from step to step, and ones that do not.

use super::*;
use crate::telemetry::snapshot::StepSizes;

/// The drafter's last steps: `steps` of them, `distinct` sizes among them.
fn drafter_sizes(steps: u32, distinct: u32) -> impl Fn(&mut Snapshot) {
    move |s: &mut Snapshot| {
        s.threads[2].sizes = Some(StepSizes {
            steps,
            distinct,
            min: 1536,
            max: 3072,
        })
    }
}

#[test]
fn shapes_that_vary_step_to_step_warn_naming_the_thread_and_the_sizes() {
    let w = run(WarnConfig::default(), 1.0, drafter_sizes(8, 5));
    assert_eq!(keys(&w), ["shapes_vary:drafter-0"]);
    assert_eq!(w[0].severity, Severity::Warn);
    assert!(
        w[0].evidence
            .contains("5 batch sizes in its last 8 steps (1536-3072 tokens)"),
        "{}",
        w[0].evidence
    );
    assert!(w[0].fix.contains("fixed lengths"), "{}", w[0].fix);
    // A second varying thread is named in the first one's warning, not warned about twice.
    let w = run(WarnConfig::default(), 1.0, |s| {
        drafter_sizes(8, 5)(s);
        s.threads[1].sizes = s.threads[2].sizes;
    });
    assert_eq!(keys(&w), ["shapes_vary:target-0"]);
    assert!(
        w[0].evidence.ends_with("; drafter-0 too"),
        "{}",
        w[0].evidence
    );
}

#[test]
fn fixed_shapes_a_few_sizes_and_too_few_steps_do_not_warn() {
    // Packed batches: one size.
    assert!(run(WarnConfig::default(), 5.0, drafter_sizes(8, 1)).is_empty());
    // Below the threshold (a last short batch, a second length): no warning.
    assert!(run(WarnConfig::default(), 5.0, drafter_sizes(8, 3)).is_empty());
    // Every step different, but not yet the steps to judge by.
    assert!(run(WarnConfig::default(), 5.0, drafter_sizes(7, 7)).is_empty());
    // The threshold is the configuration's; the rule can be switched off.
    let two = WarnConfig {
        shapes_distinct: 2,
        ..WarnConfig::default()
    };
    assert_eq!(
        keys(&run(two, 1.0, drafter_sizes(8, 2))),
        ["shapes_vary:drafter-0"]
    );
    let off = WarnConfig {
        off: vec!["shapes_vary".into()],
        ..WarnConfig::default()
    };
    assert!(run(off, 1.0, drafter_sizes(8, 8)).is_empty());
    for bad in [1, 9] {
        let c = WarnConfig {
            shapes_distinct: bad,
            ..WarnConfig::default()
        };
        let e = c.check().unwrap_err();
        assert!(
            e.contains("`warnings.shapes_distinct`") && e.contains("2 to 8"),
            "{e}"
        );
    }
}
