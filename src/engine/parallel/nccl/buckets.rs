//! Gradients all-reduced in buckets while backward runs (src/engine/parallel/nccl.rs): which
//! parameters go together (one bucket per drafter layer, last layer first, in the order backward
//! finishes them), and the shim's reducer hooked into backward over the flat gradient buffer,
//! each bucket sent out on NCCL's stream as soon as backward completes it.

use super::{ffi, NcclMember};
use crate::engine::parallel::shim::made;
use crate::engine::train::optim::AdamW;
use anyhow::{anyhow, Result};
use std::ffi::{c_int, c_void};
use tch::Tensor;

/// Whether gradients are all-reduced during backward (the default) or in one piece after it
/// (`--disable grad-sync-during-backward`, for side-by-side measurements).
pub(super) fn during_backward() -> bool {
    crate::engine::gpu::fast_paths::on(
        crate::engine::gpu::fast_paths::FastPath::GradSyncDuringBackward,
    )
}

/// A group of parameters whose gradients are all-reduced together: the parameters (indices in
/// the optimizer's order) and the contiguous spans of the flat gradient buffer they cover.
#[derive(Debug, PartialEq)]
pub struct Bucket {
    pub params: Vec<usize>,
    pub spans: Vec<(i64, i64)>,
}

/// The drafter's parameters grouped in the order backward finishes them: one bucket per decoder
/// layer, the last layer first, then everything outside the layers (the context projection and
/// its norm are the last gradients backward computes). `layout` is (name, (offset, numel)) in
/// the flat buffer's order.
pub fn plan_buckets(layout: &[(&str, (i64, i64))]) -> Vec<Bucket> {
    let layer_of = |name: &str| -> Option<usize> {
        name.strip_prefix("layers.")?
            .split('.')
            .next()?
            .parse()
            .ok()
    };
    let layers = layout.iter().filter_map(|(n, _)| layer_of(n)).max();
    let order: Vec<Option<usize>> = match layers {
        Some(top) => (0..=top).rev().map(Some).chain([None]).collect(),
        None => vec![None],
    };
    order
        .into_iter()
        .filter_map(|key| {
            let mut bucket = Bucket {
                params: Vec::new(),
                spans: Vec::new(),
            };
            for (i, (name, (off, len))) in layout.iter().enumerate() {
                if layer_of(name) != key {
                    continue;
                }
                bucket.params.push(i);
                match bucket.spans.last_mut() {
                    Some((o, l)) if *o + *l == *off => *l += len,
                    _ => bucket.spans.push((*off, *len)),
                }
            }
            (!bucket.params.is_empty()).then_some(bucket)
        })
        .collect()
}

impl NcclMember {
    /// Hooks the bucketed all-reduce into backward: the gradients move into one flat buffer
    /// (each parameter's `.grad` a view), and each bucket goes out when backward completes it.
    pub(super) fn hook_buckets(&mut self, optimizer: &mut AdamW) -> Result<()> {
        let pg = self.group()?;
        let mut flat = optimizer.keep_grads_flat(crate::engine::gpu::cuda::set_grad)?;
        let layout: Vec<(&str, &Tensor, (i64, i64))> = optimizer.layout().collect();
        let names: Vec<(&str, (i64, i64))> = layout.iter().map(|(n, _, s)| (*n, *s)).collect();
        let buckets = plan_buckets(&names);
        let mut param_bucket = vec![0 as c_int; layout.len()];
        let (mut span_bucket, mut span_off, mut span_len) = (Vec::new(), Vec::new(), Vec::new());
        for (b, bucket) in buckets.iter().enumerate() {
            for &p in &bucket.params {
                param_bucket[p] = b as c_int;
            }
            for &(off, len) in &bucket.spans {
                span_bucket.push(b as c_int);
                span_off.push(off);
                span_len.push(len);
            }
        }
        let params: Vec<*mut c_void> = layout
            .iter()
            .map(|(_, t, _)| t.as_ptr() as *mut c_void)
            .collect();
        // SAFETY: every pointer is live for the call (tch's at::Tensor*, the vectors above); the
        // shim copies what it keeps (tensor handles, the bucket tables).
        let reducer = made(|e, l| unsafe {
            ffi::dflash_reducer_new(
                pg,
                params.as_ptr(),
                params.len() as c_int,
                flat.as_mut_ptr() as *mut c_void,
                param_bucket.as_ptr(),
                buckets.len() as c_int,
                span_bucket.as_ptr(),
                span_off.as_ptr(),
                span_len.as_ptr(),
                span_bucket.len() as c_int,
                e,
                l,
            )
        })
        .map_err(|e| anyhow!("NCCL gradient buckets on rank {}: {e}", self.rank))?;
        self.reducer = reducer;
        Ok(())
    }
}
