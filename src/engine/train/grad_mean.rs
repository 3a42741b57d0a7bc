//! What the drafter's step asks of its replicas: its gradients replaced by their mean over all
//! of them. The step uses it; the multi-GPU and multi-process groups (src/engine/parallel/)
//! implement it; a lone replica is `Single`.

use crate::engine::train::optim::AdamW;
use anyhow::Result;

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
    /// After this replica failed: frees the others from any collective that waits for it.
    fn abort(&mut self) {}
    /// Whether the worker calls `mean` at all (a lone replica has nothing to average).
    fn syncs(&self) -> bool {
        self.world() > 1
    }
    /// At a periodic checkpoint of step `step`, after the saving replica wrote it: replicas of
    /// other processes wait here until it is written.
    fn checkpoint_written(&mut self, _step: u64) -> Result<()> {
        Ok(())
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
