//! Builds the models and queues from a `PipelineSpec` and runs loader → [batch queue] → targets →
//! [HS queue] → drafters, each worker on its own named thread. Stop is graceful: one
//! cancellation token, every thread joined, the first error reported. The models and the data
//! source come from `parts` (src/engine/pipeline/parts.rs).

pub mod caught;
pub mod crew;
pub mod drafter_worker;
pub mod handoff;
pub mod marks;
pub mod workers;

use super::data::PackedBatch;
use super::spec::PipelineSpec;
use crate::cancel::CancelToken;
use crate::engine::model::qwen3::Qwen3Target;
use crate::engine::parallel::nccl::NcclGroup;
use crate::engine::parallel::rank_replica::{JobGate, JobMember};
use crate::engine::parallel::ranks::{join_job, JobLink};
use crate::engine::parallel::replicas::{LocalGroup, StepMeet};
use crate::engine::pipeline::caught::caught;
use crate::engine::pipeline::crew::{spawn, Crew};
use crate::engine::pipeline::drafter_worker::{run_drafter, DrafterJob};
use crate::engine::pipeline::handoff::HiddenBatch;
use crate::engine::pipeline::workers::{
    device_name, run_loader, run_target, DataCounts, LoaderJob, TargetJob,
};
use crate::engine::train::grad_mean::Single;
use crate::engine::train::step::DrafterStep;
use crate::telemetry::queue::{monitored_queue, QueueRx, QueueTx};
use crate::telemetry::Telemetry;
use anyhow::{bail, Result};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tch::{nn::VarStore, Device};

mod memory_checks;
mod parts;
use memory_checks::{host_available_gib, memory_note, with_memory_note};
pub(crate) use parts::{build_drafters, build_target, data_source, frozen_on};
use parts::{build_targets, drafter_replicas, resumed_docs, DrafterReplica};

pub struct Pipeline {
    pub cancel: CancelToken,
    handles: Vec<JoinHandle<()>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Optimizer step the run started from (non-zero when resumed).
    pub start_step: u64,
    /// Truncated documents and skipped batches so far.
    pub counts: Arc<DataCounts>,
    /// The other ranks of a multi-process job.
    link: Option<Arc<JobLink>>,
}

pub(crate) enum Replicas {
    Single,
    Local(Arc<LocalGroup>),
    Nccl(NcclGroup),
    /// The replicas of a multi-process job, each a rank of the job's process group (on GPUs:
    /// NCCL).
    Job(Arc<JobLink>, CancelToken, bool),
}

impl Replicas {
    /// Replica `i`'s handle on the group.
    pub(crate) fn member(
        &self,
        i: usize,
    ) -> Result<Box<dyn crate::engine::train::grad_mean::GradMean>> {
        Ok(match self {
            Replicas::Local(g) => Box::new(g.member(i)),
            Replicas::Nccl(g) => Box::new(g.member(i)),
            Replicas::Single => Box::new(Single),
            Replicas::Job(link, cancel, gpu) => {
                Box::new(JobMember::new(link.clone(), cancel.clone(), *gpu, i)?)
            }
        })
    }
}

/// How the drafter replicas average gradients: NCCL when every replica has a GPU of its own,
/// the in-process group on the CPU. `--disable single-replica-shortcut` puts even one GPU drafter
/// through NCCL (world size 1), to exercise the path on a one-GPU machine.
pub(crate) fn replica_group(devices: &[Device], cancel: &CancelToken) -> Result<Replicas> {
    let all_cuda = check_replica_devices(devices)?;
    let force = !crate::engine::gpu::fast_paths::on(
        crate::engine::gpu::fast_paths::FastPath::SingleReplicaShortcut,
    );
    if devices.len() == 1 && !(force && all_cuda) {
        return Ok(Replicas::Single);
    }
    if all_cuda {
        return Ok(Replicas::Nccl(NcclGroup::new(devices.len())?));
    }
    Ok(Replicas::Local(LocalGroup::new(
        devices.len(),
        cancel.clone(),
    )))
}

/// Replicas are all on the CPU or all on GPUs, one GPU each (NCCL takes one rank a GPU).
/// Whether they are on GPUs.
pub(crate) fn check_replica_devices(devices: &[Device]) -> Result<bool> {
    let all_cuda = devices.iter().all(|d| d.is_cuda());
    if !all_cuda && devices.iter().any(|d| d.is_cuda()) {
        bail!(
            "--drafter-devices mixes cpu and cuda: replicas must all be on the CPU or all on GPUs"
        );
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = devices
        .iter()
        .find(|d| all_cuda && !seen.insert(format!("{d:?}")))
    {
        bail!(
            "--drafter-devices lists {dup:?} twice: drafter replicas on GPUs average through \
             NCCL, which needs one GPU per replica"
        );
    }
    Ok(all_cuda)
}

/// Threads for each worker's libtorch: --threads-per-worker, or the cores shared out.
fn threads_per_worker(cfg: &PipelineSpec) -> i32 {
    let n_workers = (cfg.target_devices.len() + cfg.drafter_devices.len()) as i32;
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as i32)
        .unwrap_or(1);
    cfg.threads_per_worker
        .unwrap_or((cores / n_workers.max(1)).max(1))
}

/// What keeps the replicas' steps together.
enum Gates {
    /// One replica of a single process: nothing.
    None,
    /// The replicas of one process: one gate they share.
    Local(Arc<dyn StepMeet>),
    /// The replicas of a job: a gate each, counting in the job's store.
    Job(Arc<JobLink>, CancelToken),
}

impl Gates {
    /// The gate of this process's replica `d`.
    fn of(&self, d: usize) -> Option<Arc<dyn StepMeet>> {
        match self {
            Gates::None => None,
            Gates::Local(g) => Some(g.clone()),
            Gates::Job(link, cancel) => Some(JobGate::new(link.clone(), cancel.clone(), d)),
        }
    }
}

/// How the drafter replicas average their gradients, and what keeps their steps together.
fn replica_sync(
    cfg: &PipelineSpec,
    link: Option<&Arc<JobLink>>,
    cancel: &CancelToken,
) -> Result<(Replicas, Gates)> {
    Ok(match link {
        Some(l) => {
            let on_gpus = check_replica_devices(&cfg.drafter_devices)?;
            (
                Replicas::Job(l.clone(), cancel.clone(), on_gpus),
                Gates::Job(l.clone(), cancel.clone()),
            )
        }
        None => (
            replica_group(&cfg.drafter_devices, cancel)?,
            match cfg.drafter_devices.len() {
                1 => Gates::None,
                n => Gates::Local(crate::engine::parallel::replicas::StepGate::new(
                    n,
                    cancel.clone(),
                ) as Arc<dyn StepMeet>),
            },
        ),
    })
}

/// What the workers' threads are started with.
struct Workers<'a> {
    cfg: &'a PipelineSpec,
    crew: &'a Crew,
    telemetry: &'a Telemetry,
    /// Threads for each worker's libtorch.
    threads: i32,
}

/// What every drafter replica of this process shares.
struct DrafterShared {
    group: Replicas,
    gates: Gates,
    input: QueueRx<HiddenBatch>,
    counts: Arc<DataCounts>,
    /// The job's index of this process's first replica (0 outside a job).
    first_replica: u64,
}

impl Workers<'_> {
    /// The loader: documents from the data source, packed into batches sent to `out`.
    fn spawn_loader(
        &self,
        counts: &Arc<DataCounts>,
        out: QueueTx<PackedBatch>,
    ) -> Result<JoinHandle<()>> {
        let cfg = self.cfg;
        let source = data_source(cfg, &cfg.target_config, &cfg.drafter_spec, counts)?;
        let job = LoaderJob {
            source,
            rows: cfg.batch,
            seq: cfg.seq_len,
            out,
            slow: cfg.slow.loader,
            docs_before: resumed_docs(cfg),
        };
        let (t, c) = (self.telemetry.clone(), self.crew.cancel.clone());
        spawn("loader".into(), self.crew, move || run_loader(job, t, c))
    }

    /// One target worker per target: batches from `input`, hidden states to `out`.
    fn spawn_targets(
        &self,
        targets: Vec<(VarStore, Qwen3Target)>,
        input: &QueueRx<PackedBatch>,
        out: &QueueTx<HiddenBatch>,
    ) -> Result<Vec<JoinHandle<()>>> {
        let mut handles = Vec::new();
        let devices = &self.cfg.target_devices;
        for (i, ((_vs, model), &dev)) in targets.into_iter().zip(devices).enumerate() {
            let job = TargetJob {
                model,
                device: dev,
                input: input.clone(),
                out: out.clone(),
                slow: self.cfg.slow.target,
                threads: self.threads,
            };
            let (t, c) = (self.telemetry.clone(), self.crew.cancel.clone());
            handles.push(spawn(format!("target-{i}"), self.crew, move || {
                let _keep = _vs;
                run_target(job, t, c)
            })?);
        }
        Ok(handles)
    }

    /// One drafter worker per replica.
    fn spawn_drafters(
        &self,
        drafters: Vec<DrafterReplica>,
        shared: &DrafterShared,
    ) -> Result<Vec<JoinHandle<()>>> {
        let mut handles = Vec::new();
        for (i, replica) in drafters.into_iter().enumerate() {
            let job = self.drafter_job(i, replica, shared)?;
            let (t, c) = (self.telemetry.clone(), self.crew.cancel.clone());
            handles.push(spawn(format!("drafter-{i}"), self.crew, move || {
                run_drafter(job, t, c)
            })?);
        }
        Ok(handles)
    }

    /// Replica `i`'s job.
    fn drafter_job(
        &self,
        i: usize,
        r: DrafterReplica,
        shared: &DrafterShared,
    ) -> Result<DrafterJob> {
        let (cfg, dev) = (self.cfg, r.device);
        Ok(DrafterJob {
            step: DrafterStep {
                model: r.model,
                optimizer: r.optimizer,
                spec: cfg.drafter_spec.clone(),
                embed: r.embed,
                lm_head: r.lm_head,
                device: dev,
                replicas: shared.group.member(i)?,
                loss_chunk_mib: cfg.loss_chunk_mib,
                graphs: crate::engine::train::step_graphs::StepGraphs::as_installed(),
            },
            vs: r.vs,
            input: shared.input.clone(),
            anchors: cfg.anchors,
            anchor_scope: cfg.anchor_scope,
            steps_per_batch: cfg.steps_per_batch,
            lr: cfg.lr,
            schedule: cfg.schedule,
            max_steps: cfg.steps,
            save_dir: cfg.save_dir.clone(),
            save_every: cfg.save_every,
            seed: cfg.seed + shared.first_replica + i as u64,
            // The job's replica 0's sampler saved its state; the others start theirs afresh.
            rng_state: cfg
                .resume_state
                .as_ref()
                .and_then(|s| s.anchor_rng)
                .filter(|_| shared.first_replica + i as u64 == 0),
            data_docs: resumed_docs(cfg),
            batch_steps_done: cfg
                .resume_state
                .as_ref()
                .and_then(|s| s.batch_steps_done)
                .filter(|_| shared.first_replica + i as u64 == 0)
                .unwrap_or(0),
            slow: cfg.slow.drafter,
            threads: self.threads,
            // The job's replica 0 (replica 0 of rank 0) writes the checkpoints.
            saves: shared.first_replica + i as u64 == 0,
            counts: shared.counts.clone(),
            keep: cfg.keep,
            max_nonfinite: cfg.max_nonfinite,
            prefetch: cfg.target_devices.iter().any(|&t| t != dev),
            gate: shared.gates.of(i),
        })
    }
}

impl Pipeline {
    pub fn start(cfg: &PipelineSpec, telemetry: &Telemetry) -> Result<Pipeline> {
        crate::engine::gpu::fast_paths::install(cfg.fast_paths);
        // The other ranks first: a job whose ranks disagree stops before anything is built.
        let link = cfg.job.as_ref().map(|tag| join_job(cfg, tag)).transpose()?;
        let started = Self::start_joined(cfg, telemetry, link.clone());
        if let (Err(e), Some(l)) = (&started, &link) {
            // The others hear why this rank could not start.
            l.finish(&Err(anyhow::anyhow!("{e:#}")));
        }
        started
    }

    fn start_joined(
        cfg: &PipelineSpec,
        telemetry: &Telemetry,
        link: Option<Arc<JobLink>>,
    ) -> Result<Pipeline> {
        let cancel = CancelToken::new();
        let refusal = host_available_gib().and_then(|gib| cfg.host_memory_refusal(gib));
        if let Some(refusal) = refusal {
            anyhow::bail!(refusal);
        }
        let note = memory_note(cfg);
        let crew = Crew::new(cancel.clone(), link.clone(), note.clone())?;
        // A build's out-of-memory with the note; any other error as it was.
        let noted = |e: anyhow::Error| match with_memory_note(&format!("{e:#}"), &note) {
            Some(text) => anyhow::anyhow!(text),
            None => e,
        };
        let threads = threads_per_worker(cfg);
        tch::manual_seed(cfg.seed as i64);
        let on = |devices: &[Device]| {
            let names: Vec<String> = devices.iter().map(|&d| device_name(d)).collect();
            names.join(",")
        };
        let targets = caught(
            &format!("building the target on {}", on(&cfg.target_devices)),
            || build_targets(cfg),
        )
        .map_err(noted)?;
        let (drafters, start_step) = caught(
            &format!("building the drafter on {}", on(&cfg.drafter_devices)),
            || drafter_replicas(cfg, &targets[0].1),
        )
        .map_err(noted)?;
        let (group, gates) = replica_sync(cfg, link.as_ref(), &cancel)?;
        if let Some(n) = cfg.steps {
            if start_step >= n {
                bail!("--resume is at step {start_step}, already at or past --steps {n}: raise --steps");
            }
        }

        let (batch_tx, batch_rx, batch_probe) =
            monitored_queue("batch", cfg.batch_queue, "loader", "target", cancel.clone());
        let (hs_tx, hs_rx, hs_probe) =
            monitored_queue("hs", cfg.hs_queue, "target", "drafter", cancel.clone());
        telemetry.add_queue(batch_probe);
        telemetry.add_queue(hs_probe);

        let counts = Arc::new(DataCounts::default());
        let workers = Workers {
            cfg,
            crew: &crew,
            telemetry,
            threads,
        };
        let mut handles = vec![workers.spawn_loader(&counts, batch_tx)?];
        handles.extend(workers.spawn_targets(targets, &batch_rx, &hs_tx)?);
        drop(hs_tx);
        drop(batch_rx);
        let shared = DrafterShared {
            group,
            gates,
            input: hs_rx,
            counts: counts.clone(),
            first_replica: link.as_ref().map_or(0, |l| l.replica_index(0) as u64),
        };
        handles.extend(workers.spawn_drafters(drafters, &shared)?);
        Ok(Pipeline {
            cancel,
            handles,
            errors: crew.errors,
            start_step,
            counts,
            link,
        })
    }

    /// The first error a worker reported, if any (the run stops on it); in a job, the fault of
    /// another rank that stopped this one comes first.
    pub fn first_error(&self) -> Option<String> {
        if let Some(why) = self.link.as_ref().and_then(|l| l.fault()) {
            return Some(why);
        }
        self.errors
            .lock()
            .expect("errors poisoned")
            .first()
            .cloned()
    }

    /// The other ranks of this process's job (None outside a job).
    pub fn link(&self) -> Option<&Arc<JobLink>> {
        self.link.as_ref()
    }

    pub fn is_finished(&self) -> bool {
        self.handles.iter().all(|h| h.is_finished())
    }

    /// Stops every worker, joins them, and returns the first error any of them hit.
    pub fn stop(self) -> Result<()> {
        self.cancel.cancel();
        self.join()
    }

    /// Joins every worker (after the run ended by itself or was cancelled).
    pub fn join(mut self) -> Result<()> {
        for h in std::mem::take(&mut self.handles) {
            if h.join().is_err() {
                self.errors
                    .lock()
                    .expect("errors poisoned")
                    .push("a worker thread panicked".into());
            }
        }
        let first = self.first_error();
        let outcome = match first {
            Some(e) => Err(anyhow::anyhow!("{e}")),
            None => Ok(()),
        };
        if let Some(l) = &self.link {
            l.finish(&outcome);
        }
        outcome
    }
}
