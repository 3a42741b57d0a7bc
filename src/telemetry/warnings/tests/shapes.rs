//! The `shapes_vary` rule: batch sizes that change from step to step, and ones that do not.

use super::*;
use crate::telemetry::snapshot::StepSizes;
use crate::telemetry::stall::SIZE_STEPS;

const LAST: u32 = SIZE_STEPS as u32;

/// Thread `i`'s last steps: `steps` of them, `distinct` sizes among them.
fn sizes(i: usize, steps: u32, distinct: u32) -> impl Fn(&mut Snapshot) {
    move |s: &mut Snapshot| {
        s.threads[i].sizes = Some(StepSizes {
            steps,
            distinct,
            min: 1536,
            max: 3072,
        })
    }
}

/// The base pipeline with a second drafter replica, `drafter-1`.
fn two_drafters(s: &mut Snapshot) {
    let mut d1 = s.threads[2].clone();
    d1.name = "drafter-1".into();
    s.threads.push(d1);
}

#[test]
fn shapes_that_vary_step_to_step_warn_about_the_stage_naming_a_thread_and_the_sizes() {
    let now = WarnConfig {
        shapes_s: 0.0,
        ..WarnConfig::default()
    };
    let w = run(now.clone(), 1.0, sizes(2, LAST, 12));
    assert_eq!(keys(&w), ["shapes_vary:drafter"]);
    assert_eq!(w[0].severity, Severity::Warn);
    let want = "drafter-0: 12 different sizes (tokens a step) in its last 16 steps, 1536 to 3072";
    assert!(w[0].evidence.contains(want), "{}", w[0].evidence);
    assert!(w[0].fix.contains("fixed lengths (buckets)"), "{}", w[0].fix);
    // On the CPU the fix says what it would cost on a GPU.
    assert!(
        w[0].fix.contains("on a GPU each new shape would"),
        "{}",
        w[0].fix
    );
    // Both replicas varying: one warning for the stage, counting the other; the subject stays
    // the stage's while the replicas take turns above the threshold (the hold goes on).
    let both = |s: &mut Snapshot| {
        two_drafters(s);
        sizes(2, LAST, 12)(s);
        sizes(3, LAST, 12)(s);
    };
    let w = run(now.clone(), 1.0, both);
    assert_eq!(keys(&w), ["shapes_vary:drafter"]);
    assert!(
        w[0].evidence.ends_with("; 1 other thread of the stage too"),
        "{}",
        w[0].evidence
    );
    let turns = |s: &mut Snapshot| {
        two_drafters(s);
        let first = (s.elapsed_s as u64).is_multiple_of(2);
        sizes(2, LAST, if first { 12 } else { 1 })(s);
        sizes(3, LAST, if first { 1 } else { 12 })(s);
    };
    let w = run(WarnConfig::default(), 12.0, turns);
    assert_eq!(keys(&w), ["shapes_vary:drafter"]);
    assert!(w[0].for_s >= 11.0, "held {} s", w[0].for_s);
    // On a GPU the fix names the cost there.
    let on_gpu = |s: &mut Snapshot| {
        s.threads[2].device = "cuda:0".into();
        sizes(2, LAST, 12)(s);
    };
    let w = run(now, 1.0, on_gpu);
    assert!(
        w[0].fix.contains("each new shape takes new blocks"),
        "{}",
        w[0].fix
    );
}

#[test]
fn fixed_shapes_a_few_buckets_too_few_steps_and_exited_threads_do_not_warn() {
    // Packed batches: one size.
    assert!(run(WarnConfig::default(), 30.0, sizes(2, LAST, 1)).is_empty());
    // Padded to 7 bucket lengths: below the default threshold of 8.
    assert!(run(WarnConfig::default(), 30.0, sizes(2, LAST, 7)).is_empty());
    // A young run, every step different: judged once it has shown 8 sizes.
    assert!(run(WarnConfig::default(), 30.0, sizes(2, 7, 7)).is_empty());
    assert_eq!(
        keys(&run(WarnConfig::default(), 30.0, sizes(2, 8, 8))),
        ["shapes_vary:drafter"]
    );
    // A thread that exited keeps its last sizes but is not judged.
    let exited = |s: &mut Snapshot| {
        sizes(2, LAST, 12)(s);
        s.threads[2].state = ThreadState::Exited;
    };
    assert!(run(WarnConfig::default(), 30.0, exited).is_empty());
    // It holds `shapes_s` (5 s) before it shows.
    assert!(run(WarnConfig::default(), 4.5, sizes(2, LAST, 12)).is_empty());
    assert_eq!(run(WarnConfig::default(), 5.0, sizes(2, LAST, 12)).len(), 1);
    // The threshold is the configuration's; the rule can be switched off.
    let two = WarnConfig {
        shapes_distinct: 2,
        ..WarnConfig::default()
    };
    assert_eq!(
        keys(&run(two, 5.0, sizes(2, LAST, 2))),
        ["shapes_vary:drafter"]
    );
    let off = WarnConfig {
        off: vec!["shapes_vary".into()],
        ..WarnConfig::default()
    };
    assert!(run(off, 30.0, sizes(2, LAST, LAST)).is_empty());
    for bad in [1, LAST + 1] {
        let c = WarnConfig {
            shapes_distinct: bad,
            ..WarnConfig::default()
        };
        let e = c.check().unwrap_err();
        assert!(
            e.contains("`warnings.shapes_distinct`") && e.contains("2 to 16"),
            "{e}"
        );
    }
}
