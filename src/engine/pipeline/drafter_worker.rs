//! The drafter's worker loop: it takes hidden states off the HS queue, draws each row's anchors,
//! runs a training step (alone or with its replicas), reports the step's metrics, saves
//! checkpoints when asked or due, and saves the last good step however the loop ends (the
//! saves: src/engine/pipeline/drafter_worker/saves.rs).

use super::handoff::{HiddenBatch, Prefetched};
use super::marks::Marks;
use super::workers::{device_name, slow_down, thread_name, DataCounts};
use crate::cancel::CancelToken;
use crate::engine::data::{PackedBatch, Rng};
use crate::engine::gpu::cuda::Stream;
use crate::engine::parallel::replicas::Arrival;
use crate::engine::train::recipe::STEP_PER_DOC;
use crate::engine::train::step::{DrafterStep, StepOutcome, StepProbe};
use crate::telemetry::phase_recorder::{TrainMetrics, MAX_SLOTS};
use crate::telemetry::queue::QueueRx;
use crate::telemetry::{Phase, Telemetry};
use anchors::{anchors_by_row, doc_tokens_of, share_anchors, share_by_doc};
use anyhow::Result;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tch::{nn::VarStore, Device, Tensor};

pub(crate) mod anchors;
mod saves;
use saves::ended;

pub struct DrafterJob {
    /// The replica: its model, optimizer, loss settings and replica group.
    pub step: DrafterStep,
    pub vs: VarStore,
    pub input: QueueRx<HiddenBatch>,
    pub anchors: i64,
    pub anchor_scope: crate::engine::train::blocks::AnchorScope,
    /// Optimizer steps each batch trains, each on its share of the batch's anchors.
    pub steps_per_batch: i64,
    pub lr: f64,
    pub schedule: crate::engine::train::schedule::Schedule,
    pub max_steps: Option<u64>,
    pub save_dir: Option<PathBuf>,
    pub save_every: Option<u64>,
    pub seed: u64,
    /// The anchor sampler's state saved by the run this one resumes.
    pub rng_state: Option<u64>,
    /// Documents the run had taken from its source when it resumed.
    pub data_docs: u64,
    /// Steps of the first batch the run it resumes had taken (saved partway through it).
    pub batch_steps_done: u64,
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
    pub gate: Option<std::sync::Arc<dyn crate::engine::parallel::replicas::StepMeet>>,
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

    fn in_loss(&mut self, loss: &Tensor) -> Result<()> {
        // Test-only: the loss read back a few times, as a loop logging `.item()` would.
        for _ in 0..crate::fault::item_reads_in_loss() {
            let _: f32 = crate::engine::gpu::host_sync::read(loss)?;
        }
        // Test-only: the cache emptied every step, as a loop calling torch.cuda.empty_cache()
        // (not while a graph is being captured on the device: libtorch refuses that).
        if let (true, Device::Cuda(d)) = (crate::fault::is("empty_cache"), self.device) {
            if !crate::cuda_shim::capturing(d) {
                crate::cuda_shim::empty_cache()?;
            }
        }
        Ok(())
    }
}

pub fn run_drafter(job: DrafterJob, telemetry: Telemetry, cancel: CancelToken) -> Result<()> {
    tch::set_num_threads(job.threads);
    let mut w = Worker::start(job, &telemetry, &cancel)?;
    // The loop runs under catch_unwind so that the last good step is saved after a panic or an
    // error too (the panic then goes on to the thread's wrapper, which reports it).
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<()> {
        while !cancel.is_cancelled() {
            if w.iteration()?.is_break() {
                break;
            }
        }
        Ok(())
    }));
    let saved = w.exit(&outcome);
    ended(outcome, saved)
}

/// A drafter worker: its job, its thread's marks and the next batch taken ahead, and where the
/// run stands in the last batch it took, partway through its steps or after them (exact with
/// one drafter; with several, replica 0's view: up to D-1 batches of the others may be seen
/// again or skipped).
///
/// Fields drop in order, as the loop's locals did: the batch taken ahead, the copy stream and
/// the marks before the job (its model, optimizer and queue).
struct Worker<'a> {
    next: Option<Prefetched>,
    /// On a GPU: the stream the next batch is copied on while this step computes.
    copy_stream: Option<Stream>,
    m: Marks,
    telemetry: &'a Telemetry,
    cancel: &'a CancelToken,
    device: Device,
    requests: std::sync::Arc<crate::telemetry::hub::Requests>,
    thread: String,
    iteration: u64,
    rng: Rng,
    data_docs: u64,
    /// Where the batch being trained began: the documents taken and the sampler's state before
    /// it, and (steps taken, steps) of it; a save partway through it records these.
    batch_start: (u64, u64),
    batch_steps: (u64, u64),
    /// (seq_len, batch) of the last batch.
    shape: (i64, i64),
    last_loss: Option<f32>,
    last_saved: u64,
    /// Steps skipped for a non-finite loss or gradient: in all, and in a row.
    skipped_total: u64,
    skipped_run: u32,
    job: DrafterJob,
}

impl<'a> Worker<'a> {
    fn start(
        mut job: DrafterJob,
        telemetry: &'a Telemetry,
        cancel: &'a CancelToken,
    ) -> Result<Worker<'a>> {
        let device = job.step.device;
        let rec = telemetry
            .sink()
            .recorder(crate::telemetry::Role::Drafter, &device_name(device));
        let mut m = Marks::new(rec, device, telemetry.switches().clone())?;
        m.adopt_autograd_calls();
        job.step.prepare()?;
        let copy_stream = match (device, m.stream()) {
            (Device::Cuda(i), Some(_)) if job.prefetch => Some(Stream::from_pool(i)?),
            _ => None,
        };
        let rng = match job.rng_state {
            Some(s) => Rng::from_state(s),
            None => Rng::new(
                job.seed
                    .wrapping_mul(31)
                    .wrapping_add(job.step.optimizer.step as u64),
            ),
        };
        Ok(Worker {
            telemetry,
            cancel,
            m,
            device,
            copy_stream,
            next: None,
            requests: telemetry.requests().clone(),
            thread: thread_name(),
            iteration: 0,
            rng,
            data_docs: job.data_docs,
            batch_start: (job.data_docs, 0),
            batch_steps: (0, 0),
            shape: (0, 0),
            last_loss: None,
            last_saved: job.step.optimizer.step as u64,
            skipped_total: 0,
            skipped_run: 0,
            job,
        })
    }

    /// One batch: taken, its anchors drawn and shared out over --steps-per-batch optimizer
    /// steps (its hidden states reused), each met with the replicas, trained on, saved when due.
    fn iteration(&mut self) -> Result<ControlFlow<()>> {
        self.m.hold_while_paused(self.cancel);
        let Some((hidden, b)) = self.take()? else {
            return Ok(ControlFlow::Break(()));
        };
        self.batch_start.1 = self.rng.state();
        let per_row = anchors_by_row(&b, self.job.anchors, self.job.anchor_scope, &mut self.rng);
        let parts = match self.job.steps_per_batch {
            STEP_PER_DOC => share_by_doc(&b, &per_row),
            steps => share_anchors(&per_row, steps),
        };
        let n = parts.len() as u64;
        // A run resumed from a save partway through this batch goes on from its next step.
        let done = std::mem::take(&mut self.job.batch_steps_done);
        if done >= n.max(1) {
            anyhow::bail!(
                "the checkpoint resumed says {done} steps of its batch were taken, and the batch \
                 has {n}: the checkpoint is damaged; resume from an earlier checkpoint"
            );
        }
        self.batch_steps = (done, n);
        for (j, part) in parts.iter().enumerate().skip(done as usize) {
            if j as u64 > done {
                if self.cancel.is_cancelled() {
                    return Ok(ControlFlow::Break(()));
                }
                self.m.hold_while_paused(self.cancel);
                self.m.mark(Phase::Anchors);
            }
            // The batch's tokens, shared out over its steps (they sum to the batch's); of the
            // documents', a step a document counts its own.
            let j = j as u64;
            let tokens = b.tokens() * (j + 1) / n - b.tokens() * j / n;
            let doc_tokens = match self.job.steps_per_batch {
                STEP_PER_DOC => doc_tokens_of(&b, part),
                _ => b.doc_tokens * (j + 1) / n - b.doc_tokens * j / n,
            };
            if self
                .train_on(&hidden, &b, part, (tokens, doc_tokens))?
                .is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// A step of the batch is taken (or skipped for no loss): counted, before anything saves.
    fn step_taken(&mut self, doc_tokens: u64) {
        self.batch_steps.0 += 1;
        (self.job.counts.doc_tokens).fetch_add(doc_tokens, Ordering::Relaxed);
    }

    /// One optimizer step on the batch's anchors `per_row` (`tokens`: the batch's tokens it
    /// counts for, all and of its documents).
    fn train_on(
        &mut self,
        hidden: &Tensor,
        b: &PackedBatch,
        per_row: &[Vec<i64>],
        (tokens, doc_tokens): (u64, u64),
    ) -> Result<ControlFlow<()>> {
        match self.meet(per_row) {
            Arrival::Stop => return Ok(ControlFlow::Break(())),
            Arrival::Skip => {
                let counts = &self.job.counts;
                counts.skipped_batches.fetch_add(1, Ordering::Relaxed);
                self.step_taken(doc_tokens);
                self.m.end_step(tokens, None);
                return Ok(ControlFlow::Continue(()));
            }
            Arrival::Go => {}
        }
        let lr_now = self
            .job
            .schedule
            .lr(self.job.lr, self.job.step.optimizer.step as u64);
        let mut probe = WorkerProbe {
            marks: &mut self.m,
            thread: &self.thread,
            iteration: &mut self.iteration,
            slow: self.job.slow,
            cancel: self.cancel,
            ahead: (self.copy_stream.as_ref()).map(|c| (&self.job.input, c, &mut self.next)),
            device: self.device,
        };
        let out = match self.job.step.run(hidden, b, per_row, lr_now, &mut probe) {
            Ok(out) => out,
            // The run stopped while this replica waited for the others.
            Err(_) if self.cancel.is_cancelled() => return Ok(ControlFlow::Break(())),
            Err(e) => return Err(e),
        };
        self.step_taken(doc_tokens);
        self.report(&out, lr_now, tokens)?;
        self.after_step()?;
        Ok(ControlFlow::Continue(()))
    }

    /// The hand-off: the next batch (taken ahead, else off the queue) with its hidden states on
    /// this drafter's device and stream. None when the queue has closed: the replicas stop too.
    fn take(&mut self) -> Result<Option<(Tensor, PackedBatch)>> {
        self.m.mark(Phase::HsWait);
        let taken = match self.next.take() {
            Some(p) => Some(p),
            None => self.job.input.pop().ok().map(Prefetched::Local),
        };
        let Some(taken) = taken else {
            if let Some(g) = &self.job.gate {
                g.pass(Arrival::Stop); // the others stop too
            }
            return Ok(None);
        };
        self.m.mark(Phase::Anchors);
        let (hidden, b) = taken.take(self.device, self.m.stream())?;
        self.batch_start.0 = self.data_docs;
        self.data_docs = b.docs_placed;
        self.shape = (b.seq, b.rows);
        (self.job.counts.truncated_docs).fetch_add(b.truncated, Ordering::Relaxed);
        Ok(Some((hidden, b)))
    }

    /// Whether the step is taken: no label carries loss is a skip (no optimizer step, no
    /// schedule step; counted). Replicas take the step together, skip it together or all stop
    /// (see `StepGate`); the wait for the others is replica sync.
    fn meet(&mut self, per_row: &[Vec<i64>]) -> Arrival {
        let arrival = if per_row.iter().all(Vec::is_empty) {
            Arrival::Skip
        } else {
            Arrival::Go
        };
        match &self.job.gate {
            Some(g) => {
                self.m.mark(Phase::GradSync);
                g.pass(arrival)
            }
            None => arrival,
        }
    }

    /// The step's numbers to the front-end; too many non-finite steps in a row stop the run.
    fn report(&mut self, out: &StepOutcome, lr_now: f64, tokens: u64) -> Result<()> {
        if out.finite {
            self.skipped_run = 0;
            self.last_loss = Some(out.loss);
        } else {
            self.skipped_total += 1;
            self.skipped_run += 1;
        }
        let step = self.job.step.optimizer.step;
        let block = self.job.step.spec.block_size;
        let metrics = metrics_of(out, lr_now, block, step, self.skipped_total);
        self.m.end_step(tokens, Some(metrics));
        if self.skipped_run >= self.job.max_nonfinite {
            anyhow::bail!(
                "{} steps in a row had a non-finite loss or gradient and were \
                 skipped; the run stops at step {step} (the last finite one, saved where \
                 --save-dir is set): lower `lr`, check the data, or raise --max-nonfinite",
                self.skipped_run
            );
        }
        Ok(())
    }
}

/// A step's numbers for the front-end.
fn metrics_of(out: &StepOutcome, lr_now: f64, block: i64, step: i64, skipped: u64) -> TrainMetrics {
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
