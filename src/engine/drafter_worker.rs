//! The drafter's worker loop: it takes hidden states off the HS queue, draws each row's anchors,
//! runs a training step (alone or with its replicas), reports the step's metrics, saves
//! checkpoints when asked or due, and saves the last good step however the loop ends.

use super::blocks::sample_anchors;
use super::checkpoint::{self, TrainerState};
use super::cuda::Stream;
use super::data::{PackedBatch, Rng};
use super::drafter_step::{DrafterStep, StepProbe};
use super::handoff::{HiddenBatch, Prefetched};
use super::marks::Marks;
use super::optim::AdamW;
use super::replicas::Arrival;
use super::workers::{device_name, slow_down, thread_name, DataCounts};
use crate::cancel::CancelToken;
use crate::telemetry::phase_recorder::{TrainMetrics, MAX_SLOTS};
use crate::telemetry::queue::QueueRx;
use crate::telemetry::{HubCommand, Phase, Telemetry};
use anyhow::Result;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tch::{nn::VarStore, Device, Tensor};

pub struct DrafterJob {
    /// The replica: its model, optimizer, loss settings and replica group.
    pub step: DrafterStep,
    pub vs: VarStore,
    pub input: QueueRx<HiddenBatch>,
    pub anchors: i64,
    pub anchor_scope: super::blocks::AnchorScope,
    pub lr: f64,
    pub schedule: super::schedule::Schedule,
    pub max_steps: Option<u64>,
    pub save_dir: Option<PathBuf>,
    pub save_every: Option<u64>,
    pub seed: u64,
    /// The anchor sampler's state saved by the run this one resumes.
    pub rng_state: Option<u64>,
    /// Documents the run had taken from its source when it resumed.
    pub data_docs: u64,
    pub slow: Duration,
    pub threads: i32,
    /// Only the first drafter saves checkpoints.
    pub saves: bool,
    /// Truncated documents and skipped batches, counted for the front-end.
    pub counts: std::sync::Arc<DataCounts>,
    /// Newest `step-*` checkpoints kept (None: all).
    pub keep: Option<usize>,
    /// Steps in a row with a non-finite loss or gradient before the run stops.
    pub max_nonfinite: u32,
    /// Some target runs on another device: the next batch is taken ahead and copied while this
    /// step computes (on a GPU).
    pub prefetch: bool,
    /// With replicas: where they meet before each step.
    pub gate: Option<std::sync::Arc<dyn super::replicas::StepMeet>>,
}

/// The drafter worker's side of a step: phase marks, the next batch taken ahead (on a GPU), and
/// the test-only faults and delays.
struct WorkerProbe<'a> {
    marks: &'a mut Marks,
    thread: &'a str,
    iteration: &'a mut u64,
    slow: Duration,
    cancel: &'a CancelToken,
    /// Where the next hand-off is taken ahead: the queue, the copy stream, the slot.
    ahead: Option<(
        &'a QueueRx<HiddenBatch>,
        &'a Stream,
        &'a mut Option<Prefetched>,
    )>,
    device: Device,
}

impl StepProbe for WorkerProbe<'_> {
    fn mark(&mut self, phase: Phase) {
        self.marks.mark(phase);
    }

    fn own_stream(&self) -> bool {
        self.marks.stream().is_some()
    }

    fn after_forward(&mut self, out: &mut Tensor) -> Result<()> {
        crate::fault::worker(self.thread, *self.iteration)?;
        *self.iteration += 1;
        if crate::fault::nan_at(*self.iteration) {
            *out *= f64::NAN; // test-only: a NaN loss and NaN gradients at this step
        }
        slow_down(self.slow, self.cancel);
        // The forward is queued: a batch from another GPU copied now overlaps loss and backward.
        if let (Some((input, copy, slot)), Some(own)) = (&mut self.ahead, self.marks.stream()) {
            if slot.is_none() {
                if let Some(h) = input.try_pop() {
                    **slot = Some(h.prefetch(self.device, copy, own)?);
                }
            }
        }
        Ok(())
    }
}

pub fn run_drafter(job: DrafterJob, telemetry: Telemetry, cancel: CancelToken) -> Result<()> {
    let DrafterJob {
        mut step,
        vs,
        input,
        anchors,
        anchor_scope,
        lr,
        schedule,
        max_steps,
        save_dir,
        save_every,
        seed,
        rng_state,
        mut data_docs,
        slow,
        threads,
        saves,
        counts,
        keep,
        max_nonfinite,
        prefetch,
        gate,
    } = job;
    tch::set_num_threads(threads);
    let device = step.device;
    let rec = telemetry
        .sink()
        .recorder(crate::telemetry::Role::Drafter, &device_name(device));
    let mut m = Marks::new(rec, device, telemetry.switches().clone())?;
    step.prepare()?;
    // On a GPU: the stream the next batch is copied on while this step computes.
    let copy_stream = match (device, m.stream()) {
        (Device::Cuda(i), Some(_)) if prefetch => Some(Stream::from_pool(i)?),
        _ => None,
    };
    let mut next: Option<Prefetched> = None;
    let requests = telemetry.requests().clone();
    let spec = step.spec.clone();
    let block = spec.block_size;
    let mut rng = match rng_state {
        Some(s) => Rng::from_state(s),
        None => Rng::new(
            seed.wrapping_mul(31)
                .wrapping_add(step.optimizer.step as u64),
        ),
    };
    let mut last_saved = step.optimizer.step as u64;
    let mut shape = (0, 0);
    let mut last_loss = None;
    let saver = Saver {
        dir: save_dir.as_deref(),
        schedule,
        seed,
        lr,
        anchors,
        anchor_scope,
        keep,
        spec: &spec,
        vs: &vs,
        telemetry: &telemetry,
    };
    let save = |optimizer: &AdamW, at: (u64, u64, &Rng, (i64, i64), Option<f32>)| {
        let (step, data_docs, rng, shape, last_loss) = at;
        saver.save(
            optimizer,
            Position {
                step,
                data_docs,
                anchor_rng: rng.state(),
                shape,
                last_loss,
            },
        )
    };
    let thread = thread_name();
    let mut iteration = 0;
    // Steps skipped for a non-finite loss or gradient: in all, and in a row.
    let (mut skipped_total, mut skipped_run) = (0u64, 0u32);
    // The loop runs under catch_unwind so that the last good step is saved after a panic or an
    // error too (the panic then goes on to the thread's wrapper, which reports it).
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
        while !cancel.is_cancelled() {
            m.hold_while_paused(&cancel);
            m.mark(Phase::HsWait);
            let taken = match next.take() {
                Some(p) => Some(p),
                None => input.pop().ok().map(Prefetched::Local),
            };
            let Some(taken) = taken else {
                if let Some(g) = &gate {
                    g.pass(Arrival::Stop); // the others stop too
                }
                break;
            };
            m.mark(Phase::Anchors);
            // The hand-off: hidden states and the batch move to this drafter's device and stream.
            let (hidden, b) = taken.take(device, m.stream())?;
            data_docs = b.docs_placed;
            shape = (b.seq, b.rows);
            counts
                .truncated_docs
                .fetch_add(b.truncated, Ordering::Relaxed);
            let per_row = anchors_by_row(&b, anchors, anchor_scope, &mut rng);
            // No label carries loss: no optimizer step, no schedule step; counted.
            let arrival = if per_row.iter().all(Vec::is_empty) {
                Arrival::Skip
            } else {
                Arrival::Go
            };
            // Replicas take the step together, skip it together or all stop (see `StepGate`);
            // the wait for the others is replica sync.
            let outcome = match &gate {
                Some(g) => {
                    m.mark(Phase::GradSync);
                    g.pass(arrival)
                }
                None => arrival,
            };
            match outcome {
                Arrival::Stop => break,
                Arrival::Skip => {
                    counts.skipped_batches.fetch_add(1, Ordering::Relaxed);
                    m.end_step(b.tokens(), None);
                    continue;
                }
                Arrival::Go => {}
            }
            let lr_now = schedule.lr(lr, step.optimizer.step as u64);
            let mut probe = WorkerProbe {
                marks: &mut m,
                thread: &thread,
                iteration: &mut iteration,
                slow,
                cancel: &cancel,
                ahead: copy_stream.as_ref().map(|c| (&input, c, &mut next)),
                device,
            };
            let out = match step.run(&hidden, &b, &per_row, lr_now, &mut probe) {
                Ok(out) => out,
                // The run stopped while this replica waited for the others.
                Err(_) if cancel.is_cancelled() => break,
                Err(e) => return Err(e),
            };
            if out.finite {
                skipped_run = 0;
                last_loss = Some(out.loss);
            } else {
                skipped_total += 1;
                skipped_run += 1;
            }
            let metrics = metrics_of(&out, lr_now, block, step.optimizer.step, skipped_total);
            m.end_step(b.tokens(), Some(metrics));
            if skipped_run >= max_nonfinite {
                anyhow::bail!(
                    "{skipped_run} steps in a row had a non-finite loss or gradient and were \
                     skipped; the run stops at step {} (the last finite one, saved where \
                     --save-dir is set): lower `lr`, check the data, or raise --max-nonfinite",
                    step.optimizer.step
                );
            }
            let done = step.optimizer.step as u64;
            let periodic = save_dir.is_some() && save_every.is_some_and(|n| done.is_multiple_of(n));
            if saves
                && done > last_saved
                && (periodic || requests.checkpoint_now.swap(false, Ordering::SeqCst))
            {
                let saved = save(&step.optimizer, (done, data_docs, &rng, shape, last_loss));
                // Tried: a save that failed is not tried again at the exit (one message).
                last_saved = done;
                saved?;
            }
            if periodic {
                // Replicas in other processes go on once the checkpoint is written.
                step.replicas.checkpoint_written(done)?;
            }
            // --steps counts optimizer steps of the run, so a resumed run stops at the same step.
            if max_steps.is_some_and(|n| done >= n) {
                cancel.cancel();
            }
        }
        Ok(())
    }));
    // The last good step is saved whatever ended the loop, unless it failed inside the update
    // itself (then the weights may be half-written: the previous checkpoint stands).
    let failed = !matches!(outcome, Ok(Ok(())));
    if failed {
        // The run stops (so the others end quietly), and no replica is left waiting in a
        // collective for this one.
        cancel.cancel();
        step.replicas.abort();
    }
    let in_update = failed && super::marks::phase_now() == Some(Phase::Optim);
    let saved = if saves && step.optimizer.step as u64 > last_saved && !in_update {
        let done = step.optimizer.step as u64;
        save(&step.optimizer, (done, data_docs, &rng, shape, last_loss))
    } else {
        Ok(())
    };
    ended(outcome, saved)
}

/// Where the run stands after the last batch a drafter took (exact with one drafter; with
/// several, replica 0's view: up to D-1 batches of the others may be seen again or skipped).
struct Position {
    step: u64,
    data_docs: u64,
    anchor_rng: u64,
    /// (seq_len, batch) of the last batch.
    shape: (i64, i64),
    last_loss: Option<f32>,
}

/// What a drafter's checkpoints hold besides the weights: the run's recipe and schedule.
struct Saver<'a> {
    dir: Option<&'a std::path::Path>,
    schedule: super::schedule::Schedule,
    seed: u64,
    lr: f64,
    anchors: i64,
    anchor_scope: super::blocks::AnchorScope,
    keep: Option<usize>,
    spec: &'a super::config::DrafterSpec,
    vs: &'a VarStore,
    telemetry: &'a Telemetry,
}

impl Saver<'_> {
    /// Saves `step-N` (nothing without --save-dir), prunes to --keep, says so in the header.
    fn save(&self, optimizer: &AdamW, at: Position) -> Result<()> {
        let Some(dir) = self.dir else { return Ok(()) };
        let path = dir.join(format!("step-{:06}", at.step));
        let (seq_len, batch) = at.shape;
        let state = TrainerState {
            step: at.step,
            total_steps: self.schedule.total_steps(),
            seed: self.seed,
            lr: self.lr,
            schedule: Some(self.schedule),
            data_docs: at.data_docs,
            anchor_rng: Some(at.anchor_rng),
            last_loss: at.last_loss,
            seq_len: Some(seq_len),
            batch: Some(batch),
            anchors: Some(self.anchors),
            anchor_scope: Some(self.anchor_scope),
        };
        checkpoint::save(&path, self.spec, self.vs, optimizer, &state)?;
        if let Some(n) = self.keep {
            checkpoint::prune(dir, n)?;
        }
        self.telemetry
            .command(HubCommand::Status(format!("saved {}", path.display())));
        Ok(())
    }
}

/// Each row's anchors, drawn from its documents and loss mask.
fn anchors_by_row(
    b: &PackedBatch,
    anchors: i64,
    scope: super::blocks::AnchorScope,
    rng: &mut Rng,
) -> Vec<Vec<i64>> {
    let seq = b.seq as usize;
    (0..b.rows as usize)
        .map(|r| {
            let span = r * seq..(r + 1) * seq;
            sample_anchors(
                &b.host_doc_ids[span.clone()],
                &b.host_loss_mask[span],
                anchors as usize,
                scope,
                rng,
            )
        })
        .collect()
}

/// A step's numbers for the front-end.
fn metrics_of(
    out: &super::drafter_step::StepOutcome,
    lr_now: f64,
    block: i64,
    step: i64,
    skipped: u64,
) -> TrainMetrics {
    let mut slot_acc = [0f32; MAX_SLOTS];
    for (i, a) in out.slot_acc.iter().take(MAX_SLOTS).enumerate() {
        slot_acc[i] = *a;
    }
    TrainMetrics {
        loss: Some(out.loss),
        tau: Some(out.tau),
        grad_norm: Some(out.grad_norm),
        lr: Some(lr_now as f32),
        slot_acc,
        block_size: block.min(MAX_SLOTS as i64) as u8,
        step: step as u64,
        skipped_nonfinite: skipped,
    }
}

/// The drafter's result from how its loop ended and how the last save went: a loop error comes
/// first (with a failed save added), a panic goes on after the save's failure is said.
fn ended(outcome: std::thread::Result<Result<()>>, saved: Result<()>) -> Result<()> {
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
