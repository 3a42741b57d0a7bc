//! What the drafter's worker saves (src/engine/pipeline/drafter_worker.rs): a checkpoint after
//! a step when --save-every says it is due or a viewer asked for one, the last good step however
//! the loop ends (not after a failure inside the update), `step-N` with the run's recipe,
//! schedule and where it stands, pruned to --keep; and the worker's result from how its loop
//! ended and how that last save went.

use super::Worker;
use crate::engine::checkpoint::{self, TrainerState};
use crate::telemetry::{HubCommand, Phase};
use anyhow::Result;
use std::sync::atomic::Ordering;

impl Worker<'_> {
    /// After a step: a save when due (--save-every) or asked for, the replicas told once a
    /// periodic checkpoint is written, and the stop at --steps.
    pub(super) fn after_step(&mut self) -> Result<()> {
        let done = self.job.step.optimizer.step as u64;
        let periodic = self.job.save_dir.is_some()
            && self.job.save_every.is_some_and(|n| done.is_multiple_of(n));
        if self.job.saves
            && done > self.last_saved
            && (periodic || self.requests.checkpoint_now.swap(false, Ordering::SeqCst))
        {
            let saved = self.save(done);
            // Tried: a save that failed is not tried again at the exit (one message).
            self.last_saved = done;
            saved?;
        }
        if periodic {
            // Replicas in other processes go on once the checkpoint is written.
            self.job.step.replicas.checkpoint_written(done)?;
        }
        // --steps counts optimizer steps of the run, so a resumed run stops at the same step.
        if self.job.max_steps.is_some_and(|n| done >= n) {
            self.cancel.cancel();
        }
        Ok(())
    }

    /// The last good step is saved whatever ended the loop, unless it failed inside the update
    /// itself (then the weights may be half-written: the previous checkpoint stands).
    pub(super) fn exit(&mut self, outcome: &std::thread::Result<Result<()>>) -> Result<()> {
        let failed = !matches!(outcome, Ok(Ok(())));
        if failed {
            // The run stops (so the others end quietly), and no replica is left waiting in a
            // collective for this one.
            self.cancel.cancel();
            self.job.step.replicas.abort();
        }
        let in_update = failed && crate::telemetry::phase::current() == Some(Phase::Optim);
        let done = self.job.step.optimizer.step as u64;
        if self.job.saves && done > self.last_saved && !in_update {
            self.save(done)
        } else {
            Ok(())
        }
    }

    /// Saves `step-N` with the run's recipe and schedule and where it stands (nothing without
    /// --save-dir), prunes to --keep, says so in the header.
    pub(super) fn save(&self, step: u64) -> Result<()> {
        let job = &self.job;
        let Some(dir) = job.save_dir.as_deref() else {
            return Ok(());
        };
        let path = dir.join(format!("step-{step:06}"));
        let (seq_len, batch) = self.shape;
        // Partway through a batch's steps: where the batch began, so that a resumed run takes it
        // again and goes on from its next step (with one drafter; replicas share a queue, so
        // theirs is where the last batch ended, as before).
        let (taken, of) = self.batch_steps;
        let partway = taken < of && self.job.gate.is_none();
        let (data_docs, anchor_rng) = match partway {
            true => self.batch_start,
            false => (self.data_docs, self.rng.state()),
        };
        let state = TrainerState {
            step,
            total_steps: job.schedule.total_steps(),
            seed: job.seed,
            lr: job.lr,
            schedule: Some(job.schedule),
            data_docs,
            anchor_rng: Some(anchor_rng),
            last_loss: self.last_loss,
            seq_len: Some(seq_len),
            batch: Some(batch),
            anchors: Some(job.anchors),
            anchor_scope: Some(job.anchor_scope),
            steps_per_batch: Some(job.steps_per_batch),
            // None before the batch's first step: the batch is simply to come.
            batch_steps_done: (partway && taken > 0).then_some(taken),
            optimizer_states: Some(job.step.optimizer.moment_precision().name().into()),
        };
        let (spec, optimizer) = (&job.step.spec, &job.step.optimizer);
        checkpoint::save(&path, spec, &job.vs, optimizer, &state)?;
        if let Some(n) = job.keep {
            checkpoint::prune(dir, n)?;
        }
        self.telemetry
            .command(HubCommand::Status(format!("saved {}", path.display())));
        Ok(())
    }
}

/// The drafter's result from how its loop ended and how the last save went: a loop error comes
/// first (with a failed save added), a panic goes on after the save's failure is said.
pub(super) fn ended(outcome: std::thread::Result<Result<()>>, saved: Result<()>) -> Result<()> {
    match outcome {
        Ok(Ok(())) => saved,
        Ok(Err(e)) => match saved {
            Ok(()) => Err(e),
            Err(s) => Err(e.context(format!("and saving the last step failed: {s:#}"))),
        },
        Err(panic) => {
            if let Err(s) = saved {
                eprintln!("dflash-top: saving the last step failed: {s:#}");
            }
            std::panic::resume_unwind(panic)
        }
    }
}
