//! `bench replicas`: drafter replicas against one drafter with all their rows, in one process or
//! as one rank of a job.

use crate::config::cli::BenchArgs;
use crate::engine::bench::replica_check::{relative_gap, ReplicaReport};
use crate::engine::spec::PipelineSpec;
use anyhow::{bail, Result};

/// `bench replicas`: --steps (default 20) steps of the replicas on --drafter-devices against one
/// drafter with all their rows (in a job, every rank's); fails unless the replicas end identical
/// and the loss curves agree within --tolerance at every step.
pub(super) fn replicas(args: &BenchArgs, cfg: &PipelineSpec) -> Result<()> {
    if !(args.tolerance > 0.0 && args.tolerance.is_finite()) {
        bail!("--tolerance must be a positive fraction (0.02 is 2%)");
    }
    let steps = args.train.steps.unwrap_or(20);
    let report = crate::engine::bench::replica_check::run(cfg, steps)?;
    match &cfg.job {
        Some(job) => rank_report(cfg, job, steps, args.tolerance, &report),
        None => process_report(cfg, steps, args.tolerance, &report),
    }
}

/// The check of one process's replicas, as printed.
fn process_report(
    cfg: &PipelineSpec,
    steps: u64,
    tolerance: f64,
    report: &ReplicaReport,
) -> Result<()> {
    crate::signals::outln!(
        "bench: replicas preset={} drafters={:?} (each {} rows) vs one drafter on {:?} ({} rows) \
         steps={steps}",
        cfg.preset.name,
        cfg.drafter_devices,
        cfg.batch,
        cfg.drafter_devices[0],
        cfg.batch * cfg.drafter_devices.len() as i64
    );
    print_steps("", report);
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    crate::signals::outln!(
        "bench: replicas identical after {steps} steps: {} (max |w0 - wN| = {:e})",
        if identical { "yes" } else { "no" },
        report.replica_diff
    );
    crate::signals::outln!(
        "bench: loss gap, replicas' mean vs one drafter with all their rows: max {:.3}% over the \
         steps (tolerance {:.1}%); weights max |w0 - w_single| = {:.3e}",
        gap * 100.0,
        tolerance * 100.0,
        report.single_diff
    );
    if !identical || gap > tolerance {
        bail!(
            "the replica check failed: the replicas differ or their loss left the single drafter's"
        );
    }
    crate::signals::outln!("bench: replica check passed");
    Ok(())
}

/// The check as one rank of a job: this rank's replicas against rank 0's and against one
/// drafter with every replica's rows, as printed.
fn rank_report(
    cfg: &PipelineSpec,
    job: &crate::job::JobTag,
    steps: u64,
    tolerance: f64,
    report: &ReplicaReport,
) -> Result<()> {
    let r = job.rank;
    let here = cfg.drafter_devices.len();
    crate::signals::outln!(
        "bench: replicas rank {r} of {}, {here} here on {:?} (each {} rows) vs one drafter with \
         all {} rows steps={steps}",
        job.world,
        cfg.drafter_devices,
        cfg.batch,
        cfg.batch * job.world as i64 * here as i64
    );
    print_steps(&format!("rank {r} "), report);
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    crate::signals::outln!(
        "bench: rank {r} identical to rank 0 after {steps} steps: {} (max |w0 - w{r}| = {:e}); \
         loss gap max {:.3}% (tolerance {:.1}%); max |w{r} - w_single| = {:.3e}",
        if identical { "yes" } else { "no" },
        report.replica_diff,
        gap * 100.0,
        tolerance * 100.0,
        report.single_diff
    );
    if !identical || gap > tolerance {
        bail!("the replica check failed on rank {r}: the replicas differ or their loss left the single drafter's");
    }
    crate::signals::outln!("bench: replica check passed on rank {r}");
    Ok(())
}

/// A line a step: `bench: {who}step N loss replicas=… single=… gap=…%`.
fn print_steps(who: &str, report: &ReplicaReport) {
    for (i, (m, s)) in report.losses.iter().enumerate() {
        crate::signals::outln!(
            "bench: {who}step {} loss replicas={m:.4} single={s:.4} gap={:.3}%",
            i + 1,
            relative_gap(*m as f64, *s as f64) * 100.0
        );
    }
}
