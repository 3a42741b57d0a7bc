//! `bench replicas` across the processes of a job: every rank builds the same batches from the
//! unsharded data and steps its replicas on their rows of each (src/engine/bench/replica_check.rs); the
//! ranks add up their replicas' losses and compare their weights with rank 0's through the
//! job's store.

use crate::cancel::CancelToken;
use crate::engine::parallel::ranks::JobLink;
use crate::engine::train::optim::AdamW;
use anyhow::Result;
use std::time::Duration;
use tch::{Device, Kind, Tensor};

/// How long a rank waits for the others' figures.
const WAIT: Duration = Duration::from_secs(120);

/// The sum of every replica's loss at step `s`: `mine` is this rank's replicas' sum.
pub(super) fn loss_sum(link: &JobLink, s: u64, mine: f32, cancel: &CancelToken) -> Result<f32> {
    let theirs = link.exchange(&format!("loss/{s}"), &mine.to_le_bytes(), cancel, WAIT)?;
    Ok(theirs
        .iter()
        .map(|b| f32::from_le_bytes(b[..4].try_into().unwrap_or([0; 4])))
        .sum())
}

/// The largest |weight difference| between this rank's first replica and rank 0's (weights
/// exchanged through the store).
pub(super) fn diff_from_rank_0(
    link: &JobLink,
    replica: &mut AdamW,
    cancel: &CancelToken,
) -> Result<f64> {
    let mine = replica.flat_params().to_device(Device::Cpu);
    let bytes = tensor_bytes(&mine)?;
    let every = link.exchange("weights", &bytes, cancel, WAIT)?;
    let first = Tensor::from_slice(&bytes_f32(&every[0])).view_as(&mine);
    Ok(f64::try_from(
        (&mine - first).abs().max().to_kind(Kind::Double),
    )?)
}

/// A float tensor's values as little-endian bytes.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let v = Vec::<f32>::try_from(t.to_kind(Kind::Float).flatten(0, -1))?;
    Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
