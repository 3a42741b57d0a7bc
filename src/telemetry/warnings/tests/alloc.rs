//! The `alloc_churn` rule: churn every step, warm-up, our own graph captures, retries.

use super::*;

/// The drafter on cuda:0 ends two steps a second from t=0 (the target beside it 4 ahead); the
/// allocator on cuda:0 has made `allocs(step)` device allocations (and as many frees) and
/// `retries(t)` retries by then.
fn on_cuda(
    allocs: impl Fn(u64) -> u64 + Copy,
    retries: impl Fn(f64) -> u64 + Copy,
) -> impl Fn(&mut Snapshot) {
    move |s: &mut Snapshot| {
        let step = (s.elapsed_s * 2.0) as u64;
        for t in &mut s.threads[1..] {
            t.device = "cuda:0".into();
        }
        s.threads[1].run.steps = step + 4;
        s.threads[2].run.steps = step;
        s.allocator = vec![AllocatorView {
            cuda: 0,
            reserved_bytes: 6 << 30,
            allocated_bytes: 5 << 30,
            segments: 40,
            device_allocs: allocs(step),
            device_frees: allocs(step),
            alloc_retries: retries(s.elapsed_s),
            ..AllocatorView::default()
        }];
    }
}

/// Issue 28: allocations and frees every step past warm-up warn, naming the device, the counts
/// a step and the fix; the cache filling during warm-up and then holding does not.
#[test]
fn alloc_churn_every_step_past_warm_up_but_not_a_cache_that_filled() {
    let churning = on_cuda(|step| 20 + 3 * step, |_| 0);
    let w = run(WarnConfig::default(), 15.0, &churning);
    assert_eq!(keys(&w), ["alloc_churn:cuda:0"]);
    for m in [
        "cuda:0: 120 device allocations and frees",
        "over 20 steps (6.0 a step)",
    ] {
        assert!(w[0].evidence.contains(m), "no {m} in {}", w[0].evidence);
    }
    assert!(w[0]
        .evidence
        .contains("40 segments, 6.0 GiB reserved, 5.0 GiB allocated"));
    assert!(
        w[0].fix
            .starts_with("the cache gives memory back every step"),
        "{}",
        w[0].fix
    );
    // Warm-up: 8 allocations a step for the first 6 steps, then none.
    let filled = on_cuda(|step| 8 * step.min(6), |_| 0);
    for t in [1.0, 3.0, 15.0, 60.0] {
        assert!(
            run(WarnConfig::default(), t, &filled).is_empty(),
            "at {t} s"
        );
    }
    // Below the threshold a step (the TOML's): silent.
    let cfg = WarnConfig {
        alloc_churn_per_step: 8.0,
        ..WarnConfig::default()
    };
    assert!(run(cfg, 30.0, &churning).is_empty());
}

/// A target far ahead while the drafter fills the cache in its first steps (as at 8B, where the
/// drafter's graphs are captured seconds after the target's): not past warm-up yet.
#[test]
fn alloc_churn_waits_until_every_worker_on_the_device_is_past_warm_up() {
    let drafter_late = |s: &mut Snapshot| {
        on_cuda(|_| 0, |_| 0)(s);
        let drafter = (s.elapsed_s - 9.0).max(0.0) as u64;
        s.threads[1].run.steps = (s.elapsed_s * 4.0) as u64;
        s.threads[2].run.steps = drafter;
        let a = &mut s.allocator[0];
        (a.device_allocs, a.device_frees) = (8 * drafter.min(6), 8 * drafter.min(6));
    };
    assert!(run(WarnConfig::default(), 12.0, drafter_late).is_empty());
}

/// A cache filled in warm-up, then 120 device allocations from step `from` on; our engine's
/// graph count moves at 20 s when `captured`.
fn burst_at(from: u64, captured: bool) -> impl Fn(&mut Snapshot) {
    move |s: &mut Snapshot| {
        on_cuda(
            |step| 8 * step.min(6) + if step >= from { 120 } else { 0 },
            |_| 0,
        )(s);
        s.allocator[0].graph_events = u64::from(captured && s.elapsed_s >= 20.0);
    }
}

/// A graph captured past warm-up (the drafter's pool for a new window plan) takes its memory
/// from the device: the engine's own, not churn. Churn every step between captures still warns.
#[test]
fn alloc_churn_leaves_out_our_own_graph_captures() {
    // 120 allocations in the interval of the capture: silent; the same burst with no capture
    // warns.
    assert!(run(WarnConfig::default(), 22.0, burst_at(40, true)).is_empty());
    assert_eq!(
        keys(&run(WarnConfig::default(), 22.0, burst_at(40, false))),
        ["alloc_churn:cuda:0"]
    );
    // The burst read one sample after the capture's count moved (a capture spanning a sample):
    // left out too, also once the interval of the capture itself has left the window.
    for t in [20.5, 22.0, 30.0, 30.5, 31.0] {
        assert!(
            run(WarnConfig::default(), t, burst_at(41, true)).is_empty(),
            "at {t} s"
        );
    }
    // Churn every step while graphs come and go now and then (a loop emptying the cache): only
    // the intervals around each graph event are left out; it still warns.
    let steady = |s: &mut Snapshot| {
        on_cuda(|step| 20 + 3 * step, |_| 0)(s);
        s.allocator[0].graph_events = (s.elapsed_s / 2.0) as u64;
    };
    let w = run(WarnConfig::default(), 15.0, steady);
    assert_eq!(keys(&w), ["alloc_churn:cuda:0"]);
    // The evidence says how much of the window counted.
    assert!(
        w[0].evidence
            .contains(" of the last 10 s (the rest around graph captures)"),
        "{}",
        w[0].evidence
    );
    let w = run(
        WarnConfig::default(),
        15.0,
        on_cuda(|step| 20 + 3 * step, |_| 0),
    );
    assert!(
        w[0].evidence.contains("in the last 10 s over"),
        "{}",
        w[0].evidence
    );
}

/// Issue 28: a retry warns at once, for the window, even in a cache that stopped growing; no
/// allocator figures (the CPU, no shim): silent.
#[test]
fn alloc_churn_on_a_retry_for_its_window_and_silent_without_figures() {
    let retry_at_20 = on_cuda(|step| 8 * step.min(6), |t| u64::from(t >= 20.0));
    assert!(run(WarnConfig::default(), 19.5, &retry_at_20).is_empty());
    let w = run(WarnConfig::default(), 20.0, &retry_at_20);
    assert_eq!(keys(&w), ["alloc_churn:cuda:0"]);
    assert!(
        w[0].evidence.contains("1 allocation retry"),
        "{}",
        w[0].evidence
    );
    assert!(w[0].fix.starts_with("the cache ran out"), "{}", w[0].fix);
    assert_eq!(
        keys(&run(WarnConfig::default(), 29.5, &retry_at_20)).len(),
        1
    );
    assert!(run(WarnConfig::default(), 31.0, &retry_at_20).is_empty());
    let no_figures = |s: &mut Snapshot| {
        on_cuda(|step| 20 + 3 * step, |t| t as u64)(s);
        s.allocator.clear();
    };
    assert!(run(WarnConfig::default(), 30.0, no_figures).is_empty());
}
