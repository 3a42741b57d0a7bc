//! Drafter data parallel: D replicas, one per drafter worker, average their gradients every step
//! so that they stay identical. `GradMean` is the interface; `LocalGroup` is the CPU path (the
//! replicas of one process meet at a cancellable barrier and average with libtorch ops);
//! the NCCL path (several GPUs) goes through libtorch's own `ProcessGroupNCCL`.

use super::optim::AdamW;
use crate::cancel::CancelToken;
use anyhow::{bail, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tch::Tensor;

/// Replaces a replica's gradients with their mean over all replicas.
pub trait GradMean: Send {
    /// Once, on the replica's own thread, before its first backward (the NCCL path broadcasts
    /// replica 0's weights and hooks its reduction into backward here).
    fn prepare(&mut self, _optimizer: &mut AdamW) -> Result<()> {
        Ok(())
    }
    /// After backward: the optimizer's gradients become the mean over the replicas.
    fn mean(&mut self, optimizer: &mut AdamW) -> Result<()>;
    fn world(&self) -> usize;
    /// Whether the worker calls `mean` at all (a lone replica has nothing to average).
    fn syncs(&self) -> bool {
        self.world() > 1
    }
}

/// One replica: nothing to average.
pub struct Single;

impl GradMean for Single {
    fn mean(&mut self, _optimizer: &mut AdamW) -> Result<()> {
        Ok(())
    }
    fn world(&self) -> usize {
        1
    }
}

struct Round {
    slots: Vec<Option<Tensor>>,
    arrived: usize,
    generation: u64,
}

/// The replicas of one process on the CPU.
pub struct LocalGroup {
    size: usize,
    round: Mutex<Round>,
    turn: Condvar,
    cancel: CancelToken,
}

impl LocalGroup {
    pub fn new(size: usize, cancel: CancelToken) -> Arc<LocalGroup> {
        Arc::new(LocalGroup {
            size,
            round: Mutex::new(Round {
                slots: (0..size).map(|_| None).collect(),
                arrived: 0,
                generation: 0,
            }),
            turn: Condvar::new(),
            cancel,
        })
    }

    /// The handle of replica `rank`.
    pub fn member(self: &Arc<Self>, rank: usize) -> LocalMember {
        LocalMember {
            group: self.clone(),
            rank,
        }
    }

    /// Waits until every replica arrived at this point; false if the run was cancelled first.
    fn barrier(&self) -> bool {
        let mut r = self.round.lock().expect("replica group poisoned");
        let gen = r.generation;
        r.arrived += 1;
        if r.arrived == self.size {
            r.arrived = 0;
            r.generation += 1;
            self.turn.notify_all();
            return true;
        }
        while r.generation == gen {
            if self.cancel.is_cancelled() {
                return false;
            }
            r = self
                .turn
                .wait_timeout(r, Duration::from_millis(20))
                .expect("replica group poisoned")
                .0;
        }
        true
    }
}

pub struct LocalMember {
    group: Arc<LocalGroup>,
    rank: usize,
}

impl LocalMember {
    /// Replaces `flat` with the mean of every replica's `flat`.
    fn mean_of(&mut self, flat: &mut Tensor) -> Result<()> {
        let g = &self.group;
        g.round.lock().expect("replica group poisoned").slots[self.rank] = Some(flat.copy());
        if !g.barrier() {
            bail!("stopped while replicas were averaging gradients");
        }
        let mean = {
            let r = g.round.lock().expect("replica group poisoned");
            // Replicas on other devices: their gradients come over device to device.
            let all: Vec<Tensor> = r
                .slots
                .iter()
                .map(|s| {
                    s.as_ref()
                        .expect("every replica arrived")
                        .to_device(flat.device())
                })
                .collect();
            Tensor::stack(&all, 0).mean_dim(0, false, flat.kind())
        };
        // Nobody may overwrite a slot before everyone has read them all.
        if !g.barrier() {
            bail!("stopped while replicas were averaging gradients");
        }
        flat.copy_(&mean);
        Ok(())
    }
}

impl GradMean for LocalMember {
    fn mean(&mut self, optimizer: &mut AdamW) -> Result<()> {
        self.mean_of(optimizer.gathered_grads())
    }

    fn world(&self) -> usize {
        self.group.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_end_with_the_mean_and_a_cancel_frees_a_waiter() {
        let group = LocalGroup::new(3, CancelToken::new());
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let mut m = group.member(rank);
                    std::thread::Builder::new()
                        .name(format!("replica-{rank}"))
                        .spawn_scoped(s, move || {
                            let mut last = Vec::new();
                            for step in 0..5 {
                                let mut g = Tensor::from_slice(&[
                                    rank as f32 + step as f32,
                                    10.0 * rank as f32,
                                ]);
                                m.mean_of(&mut g).unwrap();
                                last = Vec::<f32>::try_from(&g).unwrap();
                            }
                            last
                        })
                        .unwrap()
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert_eq!(r, &vec![5.0, 10.0], "mean of (0,1,2)+4 and (0,10,20)");
        }
        let cancel = CancelToken::new();
        let group = LocalGroup::new(2, cancel.clone());
        let mut lone = group.member(0);
        cancel.cancel();
        let mut g = Tensor::from_slice(&[1.0f32]);
        assert!(
            lone.mean_of(&mut g).is_err(),
            "a replica alone does not wait forever once cancelled"
        );
    }
}
