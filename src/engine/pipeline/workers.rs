//! The loader's and the target's worker loops (the drafter's is in drafter_worker.rs). Each runs on
//! its own named thread, owns its device and its phase recorder, and marks every phase of its role
//! (src/telemetry/phase.rs).

use super::handoff::HiddenBatch;
use super::marks::Marks;
use crate::cancel::CancelToken;
use crate::engine::data::{DocSource, PackedBatch, Packer};
use crate::engine::gpu::cuda::Event;
use crate::engine::model::qwen3::Qwen3Target;
use crate::engine::model::target_graph::TargetForward;
use crate::telemetry::queue::{QueueRx, QueueTx};
use crate::telemetry::{Phase, Telemetry};
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tch::Device;

/// Sleeps `d` in small slices so that a stop is not held up.
pub(super) fn slow_down(d: Duration, cancel: &CancelToken) {
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
        let batch = packer.pack(source.as_mut(), rows, crate::fault::seq_len(seq, iteration))?;
        let tokens = batch.tokens();
        m.mark(Phase::PushWait);
        if out.push(batch).is_err() {
            break;
        }
        m.end_step(tokens, None);
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
    /// Tokens of documents (their rows' padding out) in the optimizer steps the drafters took:
    /// the data a run read, whatever its rows' length.
    pub doc_tokens: AtomicU64,
}

impl DataCounts {
    /// `truncated_docs=N skipped_batches=M dropped_docs=K doc_tokens=T`.
    pub fn line(&self) -> String {
        format!(
            "truncated_docs={} skipped_batches={} dropped_docs={} doc_tokens={}",
            self.truncated_docs.load(Ordering::Relaxed),
            self.skipped_batches.load(Ordering::Relaxed),
            self.dropped_docs.load(Ordering::Relaxed),
            self.doc_tokens.load(Ordering::Relaxed)
        )
    }
}

pub(super) fn thread_name() -> String {
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
