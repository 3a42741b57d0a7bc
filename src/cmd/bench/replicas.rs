//! `bench replicas`: drafter replicas against one drafter with all their rows, in one process or
//! as one rank of a job.

use crate::cli::BenchArgs;
use crate::config::{PipelineSpec, RunConfig};
use anyhow::{bail, Result};

/// `bench replicas`: --steps (default 20) steps of the replicas on --drafter-devices against one
/// drafter with all their rows; fails unless the replicas end identical and the loss curves agree
/// within --tolerance at every step.
pub(super) fn replicas(args: &BenchArgs) -> Result<()> {
    if !(args.tolerance > 0.0 && args.tolerance.is_finite()) {
        bail!("--tolerance must be a positive fraction (0.02 is 2%)");
    }
    let cfg = RunConfig::from_args(&args.train)?.pipeline;
    let steps = args.train.steps.unwrap_or(20);
    if let Some(job) = &cfg.job {
        return replicas_of_job(&cfg, job, steps, args.tolerance);
    }
    let report = crate::engine::replica_check::run(&cfg, steps)?;
    println!(
        "bench: replicas preset={} drafters={:?} (each {} rows) vs one drafter on {:?} ({} rows) \
         steps={steps}",
        cfg.preset.name,
        cfg.drafter_devices,
        cfg.batch,
        cfg.drafter_devices[0],
        cfg.batch * cfg.drafter_devices.len() as i64
    );
    for (i, (r, s)) in report.losses.iter().enumerate() {
        println!(
            "bench: step {} loss replicas={r:.4} single={s:.4} gap={:.3}%",
            i + 1,
            (r - s).abs() / s.abs().max(1e-6) * 100.0
        );
    }
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    println!(
        "bench: replicas identical after {steps} steps: {} (max |w0 - wN| = {:e})",
        if identical { "yes" } else { "no" },
        report.replica_diff
    );
    println!(
        "bench: loss gap, replicas' mean vs one drafter with all their rows: max {:.3}% over the \
         steps (tolerance {:.1}%); weights max |w0 - w_single| = {:.3e}",
        gap * 100.0,
        args.tolerance * 100.0,
        report.single_diff
    );
    if !identical || gap > args.tolerance {
        bail!(
            "the replica check failed: the replicas differ or their loss left the single drafter's"
        );
    }
    println!("bench: replica check passed");
    Ok(())
}

/// `bench replicas` as one rank of a job: this rank's replicas against rank 0's and against one
/// drafter with every replica's rows.
fn replicas_of_job(
    cfg: &PipelineSpec,
    job: &crate::job::JobTag,
    steps: u64,
    tolerance: f64,
) -> Result<()> {
    let report = crate::engine::replica_check::run(cfg, steps)?;
    let r = job.rank;
    let here = cfg.drafter_devices.len();
    println!(
        "bench: replicas rank {r} of {}, {here} here on {:?} (each {} rows) vs one drafter with \
         all {} rows steps={steps}",
        job.world,
        cfg.drafter_devices,
        cfg.batch,
        cfg.batch * job.world as i64 * here as i64
    );
    for (i, (m, s)) in report.losses.iter().enumerate() {
        println!(
            "bench: rank {r} step {} loss replicas={m:.4} single={s:.4} gap={:.3}%",
            i + 1,
            (m - s).abs() / s.abs().max(1e-6) * 100.0
        );
    }
    let identical = report.replica_diff == 0.0;
    let gap = report.step_gap();
    println!(
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
    println!("bench: replica check passed on rank {r}");
    Ok(())
}
