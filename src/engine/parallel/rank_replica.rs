//! This process's drafter replicas in a job of several processes (src/engine/parallel/ranks.rs joins
//! the job): the step gate every replica of the job meets at before each step (`JobGate`,
//! counters in the job's store) and the gradient average (`JobMember`: libtorch's
//! `ProcessGroupGloo` on the CPU, its `ProcessGroupNCCL` on a GPU, one rank of it per replica).

use super::c10d::GlooGroup;
use super::ranks::{connect_client, store_err, JobLink, COLLECTIVE_TIMEOUT, LOST_AFTER};
use super::replicas::{Arrival, StepMeet};
use crate::cancel::CancelToken;
use crate::engine::train::grad_mean::GradMean;
use crate::engine::train::optim::AdamW;
use anyhow::{anyhow, bail, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where one replica meets the job's others before each step (the processes' `StepGate`): one
/// counter per round in the store, each replica adding 1 + STOP if it has no batch + SKIP if it
/// has nothing to train. Each replica has a gate of its own (its own count of rounds).
pub struct JobGate {
    link: Arc<JobLink>,
    round: AtomicU64,
    cancel: CancelToken,
    /// The job's index of the replica passing this gate.
    replica: usize,
}

const STOP: i64 = 1 << 20;
const SKIP: i64 = 1 << 40;

impl JobGate {
    /// The gate of this process's replica `d`.
    pub fn new(link: Arc<JobLink>, cancel: CancelToken, d: usize) -> Arc<JobGate> {
        let replica = link.replica_index(d);
        Arc::new(JobGate {
            link,
            round: AtomicU64::new(0),
            cancel,
            replica,
        })
    }

    fn try_pass(&self, arrival: Arrival) -> Result<Arrival> {
        let g = self.round.fetch_add(1, Ordering::SeqCst);
        let key = format!("gate/{g}");
        let store = &self.link.store;
        let mine = 1 + match arrival {
            Arrival::Go => 0,
            Arrival::Skip => SKIP,
            Arrival::Stop => STOP,
        };
        store
            .add(&key, mine)
            .map_err(|e| store_err(&self.link.tag, "at the step gate", e))?;
        let replicas = self.link.replicas() as i64;
        let total = self.link.poll(&self.cancel, || {
            let v = store.add(&key, 0)?;
            Ok(((v % STOP) >= replicas).then_some(v))
        })?;
        let Some(total) = total else {
            return Ok(Arrival::Stop);
        };
        // Every replica has passed the previous round: its counter can go.
        if self.replica == 0 && g > 0 {
            let _ = store.delete(&format!("gate/{}", g - 1));
        }
        Ok(if (total / STOP) % (SKIP / STOP) > 0 {
            Arrival::Stop
        } else if total / SKIP > 0 {
            Arrival::Skip
        } else {
            Arrival::Go
        })
    }
}

impl StepMeet for JobGate {
    fn pass(&self, arrival: Arrival) -> Arrival {
        match self.try_pass(arrival) {
            Ok(a) => a,
            Err(e) => {
                self.link.set_fault(format!("{e:#}"));
                self.cancel.cancel();
                Arrival::Stop
            }
        }
    }
}

/// How this process's replica averages with the others.
enum Backend {
    /// Made on first use, on the drafter's thread.
    Gloo(Option<GlooGroup>),
    Nccl(super::nccl::NcclMember),
}

/// One of this process's replicas in the job: Gloo on the CPU, NCCL on a GPU; each replica is
/// a rank of the job's process group (`JobLink::replica_index`) with a store connection of its
/// own.
pub struct JobMember {
    link: Arc<JobLink>,
    backend: Backend,
    cancel: CancelToken,
    /// The job's index of this replica.
    replica: usize,
}

impl JobMember {
    /// This process's replica `d`.
    pub fn new(
        link: Arc<JobLink>,
        cancel: CancelToken,
        on_gpu: bool,
        d: usize,
    ) -> Result<JobMember> {
        let replica = link.replica_index(d);
        let backend = match on_gpu {
            true => {
                let store = connect_client(&link.tag, COLLECTIVE_TIMEOUT)
                    .map_err(|e| store_err(&link.tag, "opening NCCL's connection", e))?;
                let group = super::nccl::NcclGroup::over(Arc::new(store), link.replicas())?;
                Backend::Nccl(group.member(replica))
            }
            false => Backend::Gloo(None),
        };
        Ok(JobMember {
            link,
            backend,
            cancel,
            replica,
        })
    }

    fn gloo(&mut self) -> Result<&mut GlooGroup> {
        let Backend::Gloo(group) = &mut self.backend else {
            bail!("not a CPU replica");
        };
        if group.is_none() {
            let tag = &self.link.tag;
            let store = connect_client(tag, COLLECTIVE_TIMEOUT)
                .map_err(|e| store_err(tag, "opening Gloo's connection", e))?;
            *group = Some(GlooGroup::new(
                &store,
                self.replica as u32,
                self.link.replicas() as u32,
                COLLECTIVE_TIMEOUT,
            )?);
        }
        Ok(group.as_mut().expect("made above"))
    }

    /// A collective's error, with the fault that explains it when the watch has one (a rank
    /// that died shows first as a closed connection).
    fn explain(&self, e: anyhow::Error) -> anyhow::Error {
        let deadline = Instant::now() + LOST_AFTER + Duration::from_secs(1);
        while self.link.fault().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        match self.link.fault() {
            Some(why) => anyhow!("{why} ({e:#})"),
            None => e,
        }
    }
}

impl GradMean for JobMember {
    /// Every replica starts from the job's replica 0's weights.
    fn prepare(&mut self, optimizer: &mut AdamW) -> Result<()> {
        let r = match &mut self.backend {
            Backend::Nccl(m) => m.prepare(optimizer),
            Backend::Gloo(_) => self
                .gloo()
                .and_then(|g| optimizer.change_flat_params(|flat| g.broadcast(flat, 0))),
        };
        r.map_err(|e| self.explain(e))
    }

    fn mean(&mut self, optimizer: &mut AdamW) -> Result<()> {
        let world = self.link.replicas() as f64;
        let r = match &mut self.backend {
            Backend::Nccl(m) => m.mean(optimizer),
            Backend::Gloo(_) => self.gloo().and_then(|g| {
                let grads = optimizer.gathered_grads();
                g.all_reduce_sum(grads)?;
                let _ = grads.g_div_scalar_(world);
                Ok(())
            }),
        };
        r.map_err(|e| self.explain(e))
    }

    fn abort(&mut self) {
        if let Backend::Nccl(m) = &mut self.backend {
            m.abort();
        }
    }

    fn world(&self) -> usize {
        self.link.replicas()
    }

    /// A periodic checkpoint: the job's replica 0 writes it, the others wait until it is written.
    fn checkpoint_written(&mut self, step: u64) -> Result<()> {
        let key = format!("saved/{step}");
        if self.replica == 0 {
            return self
                .link
                .store
                .set(&key, b"")
                .map_err(|e| store_err(&self.link.tag, "saying the checkpoint is written", e));
        }
        let store = &self.link.store;
        let found = self
            .link
            .poll(&self.cancel, || Ok(store.try_get(&key)?.map(|_| ())))?;
        if found.is_none() && !self.cancel.is_cancelled() {
            bail!("stopped while waiting for rank 0's checkpoint of step {step}");
        }
        Ok(())
    }
}
