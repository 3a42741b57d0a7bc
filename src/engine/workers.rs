//! The three worker loops. Each runs on its own named thread, owns its device and its phase
//! recorder, and marks every phase of DESIGN.md §4.

use super::blocks::{
    anchors_tensor, block_input_ids, block_labels, block_positions, label_rows, sample_anchors,
    tiled_block_mask,
};
use super::checkpoint::{self, TrainerState};
use super::config::DrafterSpec;
use super::cuda::Event;
use super::data::{DocSource, PackedBatch, Packer, Rng};
use super::drafter::Drafter;
pub use super::handoff::HiddenBatch;
use super::loss::{block_metrics, chunked_loss_backward_rows, gamma_for, slot_weights};
use super::marks::Marks;
use super::optim::AdamW;
use super::qwen3::Qwen3Target;
use super::target_graph::TargetForward;
use crate::cancel::CancelToken;
use crate::telemetry::queue::{QueueRx, QueueTx};
use crate::telemetry::recorder::{TrainMetrics, MAX_SLOTS};
use crate::telemetry::{HubCommand, Phase, Telemetry};
use anyhow::Result;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tch::{nn::VarStore, Device, Tensor};

/// Sleeps `d` in small slices so that a stop is not held up.
fn slow_down(d: Duration, cancel: &CancelToken) {
    let end = std::time::Instant::now() + d;
    while !d.is_zero() && std::time::Instant::now() < end && !cancel.is_cancelled() {
        std::thread::sleep((end - std::time::Instant::now()).min(Duration::from_millis(10)));
    }
}

pub struct LoaderJob {
    pub source: Box<dyn DocSource>,
    pub rows: i64,
    pub seq: i64,
    pub out: QueueTx<PackedBatch>,
    pub slow: Duration,
    /// Documents the source skipped (a resumed run): the packer counts on from there.
    pub docs_before: u64,
}

pub fn run_loader(job: LoaderJob, telemetry: Telemetry, cancel: CancelToken) -> Result<()> {
    let LoaderJob {
        mut source,
        rows,
        seq,
        out,
        slow,
        docs_before,
    } = job;
    let rec = telemetry
        .sink()
        .recorder(crate::telemetry::Role::Loader, "cpu");
    let mut m = Marks::new(rec, Device::Cpu, telemetry.switches().clone())?;
    let mut packer = Packer::starting_at(docs_before);
    let mut iteration = 0;
    while !cancel.is_cancelled() {
        m.hold_while_paused(&cancel);
        m.mark(Phase::Read);
        crate::fault::worker("loader", iteration)?;
        iteration += 1;
        // Reading and packing interleave in the packer; `read` covers the deliberate delay.
        slow_down(slow, &cancel);
        m.mark(Phase::Pack);
        let batch = packer.pack(source.as_mut(), rows, seq)?;
        m.mark(Phase::PushWait);
        if out.push(batch).is_err() {
            break;
        }
        m.end_step((rows * seq) as u64, None);
    }
    Ok(())
}

pub struct TargetJob {
    pub model: Qwen3Target,
    pub device: Device,
    pub input: QueueRx<PackedBatch>,
    pub out: QueueTx<HiddenBatch>,
    pub slow: Duration,
    pub threads: i32,
}

pub fn run_target(job: TargetJob, telemetry: Telemetry, cancel: CancelToken) -> Result<()> {
    let TargetJob {
        model,
        device,
        input,
        out,
        slow,
        threads,
    } = job;
    tch::set_num_threads(threads);
    let _no_grad = tch::no_grad_guard();
    let rec = telemetry
        .sink()
        .recorder(crate::telemetry::Role::Target, &device_name(device));
    let mut m = Marks::new(rec, device, telemetry.switches().clone())?;
    let thread = thread_name();
    let mut iteration = 0;
    let mut forward = TargetForward::new(&model, device);
    while !cancel.is_cancelled() {
        m.hold_while_paused(&cancel);
        m.mark(Phase::BatchWait);
        let Ok(b) = input.pop() else { break };
        m.mark(Phase::H2d);
        crate::fault::worker(&thread, iteration)?;
        iteration += 1;
        let b = b.to_device(device);
        m.mark(Phase::Forward);
        let hidden = forward.run(&model, &b, m.stream().is_some())?;
        slow_down(slow, &cancel);
        m.mark(Phase::HsPack);
        let tokens = b.tokens();
        let hidden = hidden.contiguous();
        let ready = match m.stream() {
            Some(stream) => {
                let e = Event::new(false)?;
                e.record(stream)?;
                Some(e)
            }
            None => None,
        };
        let item = HiddenBatch {
            hidden,
            batch: b,
            ready,
        };
        m.mark(Phase::HsPushWait);
        if out.push(item).is_err() {
            break;
        }
        m.end_step(tokens, None);
    }
    Ok(())
}

/// What the drafters saw of the data, for the end of a run.
#[derive(Default)]
pub struct DataCounts {
    /// Documents truncated to the row length, in the batches the drafters took.
    pub truncated_docs: AtomicU64,
    /// Batches with no label that carries loss: no optimizer step was taken on them.
    pub skipped_batches: AtomicU64,
    /// JSONL documents the loader passed over for fewer than 2 x block loss tokens (or no two
    /// in a row), each time the stream reached them.
    pub dropped_docs: AtomicU64,
}

impl DataCounts {
    /// `truncated_docs=N skipped_batches=M dropped_docs=K`.
    pub fn line(&self) -> String {
        format!(
            "truncated_docs={} skipped_batches={} dropped_docs={}",
            self.truncated_docs.load(Ordering::Relaxed),
            self.skipped_batches.load(Ordering::Relaxed),
            self.dropped_docs.load(Ordering::Relaxed)
        )
    }
}

pub struct DrafterJob {
    pub model: Drafter,
    pub vs: VarStore,
    pub optimizer: AdamW,
    pub spec: DrafterSpec,
    pub embed: Tensor,
    pub lm_head: Tensor,
    pub device: Device,
    pub input: QueueRx<HiddenBatch>,
    pub anchors: i64,
    pub lr: f64,
    pub schedule: super::optim::Schedule,
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
    /// Averages gradients with the other replicas (data parallel).
    pub replicas: Box<dyn super::replicas::GradMean>,
    /// f32 logits per lm-head chunk, MiB.
    pub loss_chunk_mib: i64,
    /// Truncated documents and skipped batches, counted for the front-end.
    pub counts: std::sync::Arc<DataCounts>,
    /// Newest `step-*` checkpoints kept (None: all).
    pub keep: Option<usize>,
    /// Steps in a row with a non-finite loss or gradient before the run stops.
    pub max_nonfinite: u32,
}

/// Rows of lm-head logits per chunk: about `mib` MiB of f32 logits at a time.
fn chunk_rows(vocab: i64, mib: i64) -> i64 {
    ((mib.max(1) << 20) / (4 * vocab.max(1))).max(16)
}

pub fn run_drafter(job: DrafterJob, telemetry: Telemetry, cancel: CancelToken) -> Result<()> {
    let DrafterJob {
        model,
        vs,
        mut optimizer,
        spec,
        embed,
        lm_head,
        device,
        input,
        anchors,
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
        mut replicas,
        loss_chunk_mib,
        counts,
        keep,
        max_nonfinite,
    } = job;
    tch::set_num_threads(threads);
    let rec = telemetry
        .sink()
        .recorder(crate::telemetry::Role::Drafter, &device_name(device));
    let mut m = Marks::new(rec, device, telemetry.switches().clone())?;
    let requests = telemetry.requests().clone();
    let block = spec.block_size;
    let weights = slot_weights(block, gamma_for(block));
    let mut rng = match rng_state {
        Some(s) => Rng::from_state(s),
        None => Rng::new(seed.wrapping_mul(31).wrapping_add(optimizer.step as u64)),
    };
    let mut last_saved = optimizer.step as u64;
    let rows_per_chunk = chunk_rows(spec.layers.vocab_size, loss_chunk_mib);
    let mut shape = (0, 0);
    let mut last_loss = None;
    // Where the run stands after the last batch this worker took (exact with one drafter; with
    // several, replica 0's view: up to D-1 batches of the others may be seen again or skipped).
    let save = |optimizer: &AdamW, at: (u64, u64, &Rng, (i64, i64), Option<f32>)| -> Result<()> {
        let Some(dir) = &save_dir else { return Ok(()) };
        let (step, data_docs, rng, (seq_len, batch), last_loss) = at;
        let path = dir.join(format!("step-{step:06}"));
        let state = TrainerState {
            step,
            total_steps: match schedule {
                super::optim::Schedule::Cosine { total } => total,
                super::optim::Schedule::Constant => 0,
            },
            seed,
            lr,
            schedule: Some(schedule),
            data_docs,
            anchor_rng: Some(rng.state()),
            last_loss,
            seq_len: Some(seq_len),
            batch: Some(batch),
            anchors: Some(anchors),
        };
        checkpoint::save(&path, &spec, &vs, optimizer, &state)?;
        if let Some(n) = keep {
            checkpoint::prune(dir, n)?;
        }
        telemetry.command(HubCommand::Status(format!("saved {}", path.display())));
        Ok(())
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
            let Ok(b) = input.pop() else { break };
            m.mark(Phase::Anchors);
            // The hand-off: hidden states and the batch move to this drafter's device and stream.
            let (hidden, b) = b.receive(device)?;
            data_docs = b.docs_placed;
            shape = (b.seq, b.rows);
            counts
                .truncated_docs
                .fetch_add(b.truncated, Ordering::Relaxed);
            let (ids, pos, docs, lmask) = (&b.input_ids, &b.positions, &b.doc_ids, &b.loss_mask);
            let seq = b.seq as usize;
            let per_row: Vec<Vec<i64>> = (0..b.rows as usize)
                .map(|r| {
                    let span = r * seq..(r + 1) * seq;
                    sample_anchors(
                        &b.host_doc_ids[span.clone()],
                        &b.host_loss_mask[span],
                        block as usize,
                        anchors as usize,
                        &mut rng,
                    )
                })
                .collect();
            if per_row.iter().all(Vec::is_empty) {
                // No label carries loss: no optimizer step, no schedule step; counted.
                counts.skipped_batches.fetch_add(1, Ordering::Relaxed);
                m.end_step(b.tokens(), None);
                continue;
            }
            // Padded to a whole number of attention tiles: few distinct shapes, full tiles.
            let width = super::tiled::padded_width(per_row.iter().map(Vec::len).max().unwrap_or(0));
            let anch = anchors_tensor(&per_row, width, device);
            let block_ids = block_input_ids(ids, &anch, block, spec.mask_token_id);
            let block_pos = block_positions(pos, &anch, block);
            let mask = super::tiled::AttnMask::Tiled(tiled_block_mask(docs, &anch, block));
            let (labels, valid) = block_labels(ids, docs, lmask, &anch, block);
            let keep = Tensor::from_slice(&label_rows(
                &per_row,
                width,
                block as usize,
                &b.host_doc_ids,
                &b.host_loss_mask,
                seq,
            ))
            .to_device(device);
            m.mark(Phase::Forward);
            crate::fault::worker(&thread, iteration)?;
            iteration += 1;
            let block_emb =
                Tensor::embedding(&embed, &block_ids, -1, false, false).to_kind(hidden.kind());
            let mut out = model.forward_masked(&hidden, pos, &block_emb, &block_pos, &mask);
            if crate::fault::nan_at(iteration) {
                out *= f64::NAN; // test-only: a NaN loss and NaN gradients at this step
            }
            slow_down(slow, &cancel);
            m.mark(Phase::Loss);
            let (loss, backward) = chunked_loss_backward_rows(
                &out,
                &lm_head,
                &labels,
                &valid,
                &keep,
                &weights,
                rows_per_chunk,
            );
            m.mark(Phase::Backward);
            backward();
            if replicas.syncs() {
                m.mark(Phase::GradSync);
                if let Err(e) = replicas.mean(optimizer.gathered_grads()) {
                    if cancel.is_cancelled() {
                        break; // the run stopped while we waited for the other replicas
                    }
                    return Err(e);
                }
            }
            m.mark(Phase::Clip);
            let grad_norm = optimizer.clip_grad_norm(1.0);
            m.mark(Phase::Optim);
            let step = optimizer.step as u64;
            let lr_now = schedule.lr(lr, step);
            // A non-finite loss or gradient skips the update, decided on the device (no sync here).
            let finite = loss.loss.isfinite().logical_and(&grad_norm.isfinite());
            optimizer.step_if(lr_now, &finite);
            m.mark(Phase::Metrics);
            let (acc, tau) = block_metrics(&loss.correct, &valid, &anch.valid);
            let packed = Tensor::cat(
                &[
                    loss.loss.view([1]),
                    tau.view([1]),
                    grad_norm.view([1]),
                    finite.to_kind(tch::Kind::Float).view([1]),
                    acc,
                ],
                0,
            );
            let mut host = Vec::<f32>::try_from(packed.to_device(Device::Cpu))?; // the one transfer
            let was_finite = host.remove(3) > 0.5;
            if was_finite {
                skipped_run = 0;
                last_loss = Some(host[0]);
            } else {
                optimizer.unstep();
                skipped_total += 1;
                skipped_run += 1;
            }
            let mut slot_acc = [0f32; MAX_SLOTS];
            for (i, a) in host[3..].iter().take(MAX_SLOTS).enumerate() {
                slot_acc[i] = *a;
            }
            let metrics = TrainMetrics {
                loss: host[0],
                tau: host[1],
                grad_norm: host[2],
                lr: lr_now as f32,
                slot_acc,
                block_size: block.min(MAX_SLOTS as i64) as u8,
                step: optimizer.step as u64,
                skipped_nonfinite: skipped_total,
            };
            m.end_step(b.tokens(), Some(metrics));
            if skipped_run >= max_nonfinite {
                anyhow::bail!(
                    "{skipped_run} steps in a row had a non-finite loss or gradient and were \
                     skipped; the run stops at step {} (the last finite one, saved where \
                     --save-dir is set): lower `lr`, check the data, or raise --max-nonfinite",
                    optimizer.step
                );
            }
            let step = optimizer.step as u64;
            if saves && step > last_saved {
                let periodic = save_every.is_some_and(|n| step.is_multiple_of(n));
                if periodic || requests.checkpoint_now.swap(false, Ordering::SeqCst) {
                    save(&optimizer, (step, data_docs, &rng, shape, last_loss))?;
                    last_saved = step;
                }
            }
            // --steps counts optimizer steps of the run, so a resumed run stops at the same step.
            if max_steps.is_some_and(|n| step >= n) {
                cancel.cancel();
            }
        }
        Ok(())
    }));
    // The last good step is saved whatever ended the loop, unless it failed inside the update
    // itself (then the weights may be half-written: the previous checkpoint stands).
    let failed = !matches!(outcome, Ok(Ok(())));
    let in_update = failed && super::marks::phase_now() == Some(Phase::Optim);
    let saved = if saves && optimizer.step as u64 > last_saved && !in_update {
        let step = optimizer.step as u64;
        save(&optimizer, (step, data_docs, &rng, shape, last_loss))
    } else {
        Ok(())
    };
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

fn thread_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("worker")
        .to_string()
}

pub fn device_name(d: Device) -> String {
    match d {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Compile-time check: what crosses the queues can cross threads.
#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<HiddenBatch>();
    is_send::<PackedBatch>();
}
