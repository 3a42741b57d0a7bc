//! The learning-rate schedule: SpecForge's cosine with warm-up for a run of known length, a
//! warm-up to a constant peak for an open one.

/// Warm-up of a run with no end (no `--steps`): 4% of SpecForge's 10,000 `max_steps`.
pub const OPEN_WARMUP_STEPS: u64 = 400;

/// The learning-rate schedule of a run: with `--steps N`, SpecForge's cosine with 4% warm-up
/// over N steps, to zero at N; without an end, linear warm-up over `OPEN_WARMUP_STEPS`, then the
/// peak lr, constant (no horizon to decay towards, so no cliff).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Schedule {
    Cosine { total: u64 },
    Constant,
}

impl Schedule {
    pub fn for_steps(steps: Option<u64>) -> Schedule {
        match steps {
            Some(total) => Schedule::Cosine { total },
            None => Schedule::Constant,
        }
    }

    /// The lr of the update that makes optimizer step `step + 1`.
    pub fn lr(&self, peak: f64, step: u64) -> f64 {
        match *self {
            Schedule::Cosine { total } => cosine_lr(peak, step, total, 0.04),
            Schedule::Constant => peak * ((step + 1) as f64 / OPEN_WARMUP_STEPS as f64).min(1.0),
        }
    }

    /// The run's length the schedule decays over (0: an open-ended run), as a checkpoint
    /// records it.
    pub fn total_steps(&self) -> u64 {
        match self {
            Schedule::Cosine { total } => *total,
            Schedule::Constant => 0,
        }
    }

    /// `cosine(total=N,warmup=4%)` or `constant(warmup=400)`.
    pub fn describe(&self) -> String {
        match self {
            Schedule::Cosine { total } => format!("cosine(total={total},warmup=4%)"),
            Schedule::Constant => format!("constant(warmup={OPEN_WARMUP_STEPS})"),
        }
    }
}

/// Cosine schedule with linear warm-up over `warmup_share` of `total` steps (whole steps,
/// rounded down as SpecForge's `int(warmup_ratio * total_steps)`; at least one), to zero.
/// tests/parity/step.rs holds it to SpecForge's scheduler.
pub fn cosine_lr(peak: f64, step: u64, total: u64, warmup_share: f64) -> f64 {
    let total = total.max(1) as f64;
    // A fraction of a step would put the last warm-up step above the peak.
    let warm = (total * warmup_share).floor().max(1.0);
    let s = step as f64;
    if s < warm {
        return peak * (s + 1.0) / warm;
    }
    let progress = ((s - warm) / (total - warm).max(1.0)).min(1.0);
    0.5 * peak * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_zero() {
        assert!(cosine_lr(1.0, 0, 100, 0.04) < 0.3);
        assert!((cosine_lr(1.0, 3, 100, 0.04) - 1.0).abs() < 1e-9);
        assert!((cosine_lr(1.0, 4, 100, 0.04) - 1.0).abs() < 1e-9);
        assert!(cosine_lr(1.0, 50, 100, 0.04) < 0.6);
        assert!(cosine_lr(1.0, 100, 100, 0.04) < 1e-9);
    }

    #[test]
    fn the_lr_never_exceeds_the_peak() {
        // 4% of 30 is 1.2 steps, of 110 4.4: the warm-up is 1 and 4 whole steps.
        for total in 1..300 {
            for step in 0..total {
                let lr = cosine_lr(1.0, step, total, 0.04);
                assert!(lr <= 1.0 + 1e-12, "total {total}, step {step}: {lr}");
            }
        }
        assert_eq!(cosine_lr(1.0, 3, 110, 0.04), 1.0);
        assert_eq!(cosine_lr(1.0, 0, 30, 0.04), 1.0);
    }

    #[test]
    fn an_open_run_warms_up_then_stays_at_the_peak() {
        let s = Schedule::Constant;
        assert!(s.lr(1.0, 0) < 0.01);
        assert!((s.lr(1.0, OPEN_WARMUP_STEPS - 1) - 1.0).abs() < 1e-12);
        for step in [10_000, 10_001, 1_000_000] {
            assert_eq!(s.lr(1.0, step), 1.0, "no cliff at step {step}");
        }
        assert_eq!(Schedule::for_steps(Some(7)), Schedule::Cosine { total: 7 });
    }
}
