//! What a resumed run takes from its checkpoint and what it refuses to change: the seed, the lr
//! schedule, and a data position it could have reached.

use super::FileConfig;
use crate::config::cli::TrainArgs;
use crate::engine::checkpoint;
use crate::engine::train::blocks::AnchorScope;
use crate::engine::train::recipe::{steps_per_batch_name, Recipe, STEP_PER_DOC};
use crate::engine::train::schedule::Schedule;
use anyhow::{bail, Result};
use std::path::Path;

/// A resumed synthetic stream is re-made document by document up to its saved position: a
/// position no run of that length could reach is damage, refused before it costs hours.
pub(super) fn check_data_position(
    state: &checkpoint::TrainerState,
    dir: Option<&Path>,
) -> Result<()> {
    let rows = state.batch.unwrap_or(1).max(1) as u64;
    let seq = state.seq_len.unwrap_or(3072).max(1) as u64;
    // At most a document a token, a row of `seq` tokens, a batch per step and one more in flight.
    let most = state
        .step
        .saturating_add(1)
        .saturating_mul(rows)
        .saturating_mul(seq)
        .saturating_mul(64);
    if state.data_docs > most {
        let file = dir.unwrap_or(Path::new(".")).join(checkpoint::TRAINER_FILE);
        bail!(
            "{}: `data_docs` {} is more than {} steps of {rows} rows of {seq} tokens could take: \
             the checkpoint is damaged; resume from an earlier checkpoint",
            file.display(),
            state.data_docs,
            state.step
        );
    }
    Ok(())
}

/// A checkpoint saved partway through a batch's steps resumes at the next of them: only with
/// the batch and its steps as they were saved (rows, their length, the anchors and their budget,
/// the steps a batch), and only where fewer were taken than there are.
pub(super) fn check_batch_steps(
    state: &checkpoint::TrainerState,
    recipe: &Recipe,
    dir: Option<&Path>,
) -> Result<()> {
    let Some(taken) = state.batch_steps_done else {
        return Ok(());
    };
    let file = dir.unwrap_or(Path::new(".")).join(checkpoint::TRAINER_FILE);
    let saved = state.steps_per_batch.unwrap_or(1);
    let past_the_end = saved != STEP_PER_DOC && taken >= saved.max(1) as u64;
    if taken == 0 || past_the_end {
        bail!(
            "{}: `batch_steps_done` {taken} is not between 1 and the steps a batch it was saved \
             with ({saved}): the checkpoint is damaged; resume from an earlier checkpoint",
            file.display()
        );
    }
    let name = |v: Option<i64>| v.map_or_else(|| "-".into(), |v| v.to_string());
    let scope = |s: Option<AnchorScope>| s.unwrap_or(AnchorScope::PerRow).name().to_string();
    let flags = [
        (
            "steps-per-batch",
            steps_per_batch_name(recipe.steps_per_batch),
            steps_per_batch_name(saved),
        ),
        ("seq-len", recipe.seq_len.to_string(), name(state.seq_len)),
        ("batch", recipe.batch.to_string(), name(state.batch)),
        ("anchors", recipe.anchors.to_string(), name(state.anchors)),
        (
            "anchor-budget",
            recipe.anchor_scope.name().to_string(),
            scope(state.anchor_scope),
        ),
    ];
    for (flag, given, saved) in flags {
        if given != saved && saved != "-" {
            bail!(
                "--{flag} {given}: {} was saved after {taken} of a batch's steps, with --{flag} \
                 {saved}; resume with --{flag} {saved} (or leave it out), or from a checkpoint \
                 at the end of a batch",
                file.display()
            );
        }
    }
    Ok(())
}

/// The seed: a resumed run's is its checkpoint's (the target's random weights, the data order
/// and the synthetic data come from it); a different one given is refused, as another run.
pub(super) fn run_seed(
    given: Option<u64>,
    state: Option<&checkpoint::TrainerState>,
    dir: Option<&Path>,
) -> Result<u64> {
    let Some(state) = state else {
        return Ok(given.unwrap_or(0));
    };
    if let Some(seed) = given.filter(|s| *s != state.seed) {
        let file = dir.unwrap_or(Path::new(".")).join(checkpoint::TRAINER_FILE);
        bail!(
            "`seed` {seed} differs from the run in {} (seed {}): a resumed run keeps its seed; \
             leave --seed out, or start a new run from those weights with --drafter",
            file.display(),
            state.seed
        );
    }
    Ok(state.seed)
}

/// The schedule of a resumed run: its checkpoint's. --steps only says where to stop, within it;
/// a different --lr is refused (it would be another run).
pub(super) fn resumed_schedule(
    state: &checkpoint::TrainerState,
    steps: Option<u64>,
    lr_given: Option<f64>,
    dir: Option<&Path>,
) -> Result<Schedule> {
    let file = dir.unwrap_or(Path::new(".")).join(checkpoint::TRAINER_FILE);
    let schedule = state.schedule();
    if let Some(lr) = lr_given.filter(|lr| *lr != state.lr) {
        bail!(
            "`lr` {lr:e} differs from the run in {} (lr {:e}): a resumed run keeps its schedule; \
             leave --lr out, or start a new run from those weights with --drafter",
            file.display(),
            state.lr
        );
    }
    if let (Schedule::Cosine { total }, Some(n)) = (schedule, steps) {
        if n > total {
            bail!(
                "--steps {n} is past the end of the schedule of the run in {} (cosine over {total} \
                 steps; the lr is 0 after it): give --steps {total} or less, or start a new run \
                 from those weights with --drafter",
                file.display()
            );
        }
    }
    Ok(schedule)
}

/// A resumed run's trainer state (`--resume`; None for a fresh run). A resumed run is the same
/// run: its data recipe and schedule come from its checkpoint. A checkpoint (`--resume`,
/// `--drafter`) is checked whole before any of it is read.
pub(super) fn resume_state_of(
    args: &TrainArgs,
    file: &FileConfig,
) -> Result<Option<checkpoint::TrainerState>> {
    for dir in [&args.resume, &args.drafter.clone().or(file.drafter.clone())]
        .into_iter()
        .flatten()
        .filter(|d| d.is_dir())
    {
        crate::engine::checkpoint::checksum::verify(dir)?;
    }
    match &args.resume {
        Some(dir) if dir.is_dir() => Ok(Some(checkpoint::read_trainer_state(dir)?)),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_save_partway_through_a_batch_resumes_only_with_its_steps_a_batch() {
        let dir = Some(Path::new("ck"));
        let partway = |taken, of| checkpoint::TrainerState {
            steps_per_batch: Some(of),
            batch_steps_done: Some(taken),
            ..Default::default()
        };
        let recipe = |steps| Recipe {
            steps_per_batch: steps,
            ..Recipe::specforge()
        };
        assert!(check_batch_steps(&partway(2, 3), &recipe(3), dir).is_ok());
        let e = check_batch_steps(&partway(2, 3), &recipe(6), dir).unwrap_err();
        assert!(e.to_string().contains("--steps-per-batch 3"), "{e}");
        // The batch taken again must be the batch: its rows' length as saved.
        let long_rows = checkpoint::TrainerState {
            seq_len: Some(1024),
            ..partway(2, 3)
        };
        let e = check_batch_steps(&long_rows, &recipe(3), dir).unwrap_err();
        assert!(
            e.to_string().contains("--seq-len 3072") && e.to_string().contains("--seq-len 1024"),
            "{e}"
        );
        for damaged in [partway(0, 3), partway(3, 3), partway(1, 0)] {
            let e = check_batch_steps(&damaged, &recipe(3), dir).unwrap_err();
            assert!(e.to_string().contains("ck/trainer_state.json"), "{e}");
            assert!(e.to_string().contains("damaged"), "{e}");
        }
        // A save at a batch's end says nothing of it: any steps a batch will do.
        let at_end = checkpoint::TrainerState::default();
        assert!(check_batch_steps(&at_end, &recipe(7), dir).is_ok());
    }

    #[test]
    fn a_resumed_run_keeps_its_schedule() {
        let cosine = checkpoint::TrainerState {
            step: 3,
            total_steps: 6,
            lr: 1e-3,
            schedule: Some(Schedule::Cosine { total: 6 }),
            ..Default::default()
        };
        let dir = Path::new("ck");
        assert_eq!(
            resumed_schedule(&cosine, Some(6), None, Some(dir)).unwrap(),
            Schedule::Cosine { total: 6 }
        );
        let e = resumed_schedule(&cosine, Some(9), None, Some(dir)).unwrap_err();
        assert!(e.to_string().contains("ck/trainer_state.json"), "{e}");
        let e = resumed_schedule(&cosine, None, Some(2e-3), Some(dir)).unwrap_err();
        assert!(e.to_string().contains("--drafter"), "{e}");
        // An open run stays open: --steps only stops it, no decay appears.
        let open = checkpoint::TrainerState {
            schedule: Some(Schedule::Constant),
            ..cosine
        };
        assert_eq!(
            resumed_schedule(&open, Some(100), None, Some(dir)).unwrap(),
            Schedule::Constant
        );
    }
}
