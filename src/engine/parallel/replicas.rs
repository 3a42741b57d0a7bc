//! Drafter data parallel: D replicas, one per drafter worker, average their gradients every step
//! so that they stay identical. `GradMean` (src/engine/train/grad_mean.rs) is the interface; `LocalGroup` is the CPU path (the
//! replicas of one process meet at a cancellable barrier and average with libtorch ops);
//! the NCCL path (several GPUs) goes through libtorch's own `ProcessGroupNCCL`.

use crate::cancel::CancelToken;
use crate::engine::train::grad_mean::GradMean;
use crate::engine::train::optim::AdamW;
use anyhow::{bail, Result};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tch::Tensor;

/// Where replicas meet before each step: they take it together, skip it together or all stop.
pub trait StepMeet: Send + Sync {
    /// Arrives with `arrival`; the round's outcome, the most severe arrival.
    fn pass(&self, arrival: Arrival) -> Arrival;
}

impl StepMeet for StepGate {
    fn pass(&self, arrival: Arrival) -> Arrival {
        StepGate::pass(self, arrival)
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

/// What a replica brings to the step gate, and what the round decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arrival {
    /// A batch to train on.
    Go,
    /// A batch with nothing to train on (no label carries loss).
    Skip,
    /// No batch: the run stopped or the data ended.
    Stop,
}

/// Where drafter replicas meet before each step: they take it together, skip it together or all
/// stop. A replica with no batch stops them all, and one with nothing to train on makes all skip,
/// so that none is left waiting in a collective for a replica that is not there; a paused
/// replica holds the others here, on the host, not inside NCCL.
pub struct StepGate {
    size: usize,
    state: Mutex<GateState>,
    turn: Condvar,
    cancel: CancelToken,
}

struct GateState {
    arrived: usize,
    /// Arrivals so far this round, by kind (Go, Skip, Stop).
    kinds: [usize; 3],
    generation: u64,
    /// What the last completed round decided: the most severe arrival.
    outcome: Arrival,
}

fn slot(a: Arrival) -> usize {
    match a {
        Arrival::Go => 0,
        Arrival::Skip => 1,
        Arrival::Stop => 2,
    }
}

impl StepGate {
    pub fn new(size: usize, cancel: CancelToken) -> Arc<StepGate> {
        Arc::new(StepGate {
            size,
            state: Mutex::new(GateState {
                arrived: 0,
                kinds: [0; 3],
                generation: 0,
                outcome: Arrival::Go,
            }),
            turn: Condvar::new(),
            cancel,
        })
    }

    /// Arrives with `arrival` and waits for the others: the round's outcome is the most severe
    /// arrival (Stop over Skip over Go); Stop when the run was cancelled before all came.
    pub fn pass(&self, arrival: Arrival) -> Arrival {
        let mut s = self.state.lock().expect("step gate poisoned");
        let gen = s.generation;
        s.arrived += 1;
        s.kinds[slot(arrival)] += 1;
        if s.arrived == self.size {
            s.outcome = [Arrival::Stop, Arrival::Skip]
                .into_iter()
                .find(|a| s.kinds[slot(*a)] > 0)
                .unwrap_or(Arrival::Go);
            s.arrived = 0;
            s.kinds = [0; 3];
            s.generation += 1;
            self.turn.notify_all();
            return s.outcome;
        }
        loop {
            if s.generation != gen {
                return s.outcome;
            }
            if self.cancel.is_cancelled() {
                // Leaves as if it never came, so a late replica cannot complete this round alone.
                s.arrived -= 1;
                s.kinds[slot(arrival)] -= 1;
                return Arrival::Stop;
            }
            s = self
                .turn
                .wait_timeout(s, Duration::from_millis(20))
                .expect("step gate poisoned")
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_take_a_step_together_skip_it_together_or_all_stop() {
        use Arrival::*;
        let gate = StepGate::new(3, CancelToken::new());
        let round = |arrivals: [Arrival; 3]| -> Vec<Arrival> {
            std::thread::scope(|s| {
                let hs: Vec<_> = arrivals
                    .iter()
                    .map(|a| {
                        let g = &gate;
                        s.spawn(move || g.pass(*a))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        assert_eq!(round([Go; 3]), vec![Go; 3]);
        assert_eq!(
            round([Go, Skip, Go]),
            vec![Skip; 3],
            "nothing to train on: all skip"
        );
        assert_eq!(
            round([Skip, Stop, Go]),
            vec![Stop; 3],
            "one without a batch stops all"
        );
        assert_eq!(round([Go; 3]), vec![Go; 3], "the next round starts clean");

        // A replica that left on cancel does not count: a late one cannot pass alone.
        let cancel = CancelToken::new();
        let gate = StepGate::new(2, cancel.clone());
        let early = std::thread::scope(|s| {
            let h = s.spawn(|| gate.pass(Go));
            std::thread::sleep(Duration::from_millis(60));
            cancel.cancel();
            h.join().unwrap()
        });
        assert_eq!(early, Stop, "a waiter is freed by the cancel");
        assert_eq!(
            gate.pass(Go),
            Stop,
            "the late replica does not enter the step alone"
        );
    }

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
