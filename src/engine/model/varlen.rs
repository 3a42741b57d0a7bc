//! The target's attention without a mask tensor: the packed rows' documents as variable-length
//! sequences for a causal flash kernel, so the work the document-causal mask hides (other
//! documents, later tokens) is never done. Used on CUDA in half precision; elsewhere the dense
//! mask path runs, and the two agree (tests/attention.rs checks it on the GPU).

use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a target forward in this process went through the flash kernel (for `bench`).
static USED: AtomicBool = AtomicBool::new(false);

/// "flash" once the flash path ran in this process, else "dense".
pub fn attention_used() -> &'static str {
    if USED.load(Ordering::Relaxed) {
        "flash"
    } else {
        "dense"
    }
}
use tch::{Device, Kind, Tensor};

/// Where each document starts in the flattened batch (and the total at the end), and the longest
/// document: a document ends where its id changes or its row ends.
pub fn cu_seqlens(doc_ids: &[i64], seq: usize) -> (Vec<i32>, i64) {
    let mut cu = vec![0i32];
    let mut max_len = 0;
    let mut start = 0;
    for i in 1..=doc_ids.len() {
        if i == doc_ids.len() || i % seq == 0 || doc_ids[i] != doc_ids[i - 1] {
            cu.push(i as i32);
            max_len = max_len.max(i - start);
            start = i;
        }
    }
    (cu, max_len as i64)
}

/// The documents of a batch as one packed sequence list: cumulative starts over all rows.
#[derive(Debug)]
pub struct Varlen {
    /// int32 [n_docs + 1] on the batch's device.
    pub cu_seqlens: Tensor,
    /// The longest document.
    pub max_len: i64,
}

impl Varlen {
    /// The same sequence list (the tensor shared).
    pub fn share(&self) -> Varlen {
        Varlen {
            cu_seqlens: self.cu_seqlens.shallow_clone(),
            max_len: self.max_len,
        }
    }

    /// From the host copy of the batch's document ids [rows * seq]: a document ends where its id
    /// changes or its row ends (padding is a segment of its own; its outputs are not read).
    pub fn from_doc_ids(doc_ids: &[i64], seq: usize, device: Device) -> Varlen {
        let (cu, max_len) = cu_seqlens(doc_ids, seq);
        Varlen::from_cu(&cu, max_len, device)
    }

    /// From `cu_seqlens`' host result (the offsets and the longest document).
    pub fn from_cu(cu: &[i32], max_len: i64, device: Device) -> Varlen {
        Varlen {
            cu_seqlens: crate::engine::gpu::cuda::upload(&Tensor::from_slice(cu), device),
            max_len,
        }
    }

    /// Whether the flash path can run for activations of `kind` and `head_dim` on `device`.
    pub fn usable(device: Device, kind: Kind, head_dim: i64) -> bool {
        crate::cuda_shim::AVAILABLE
            && device.is_cuda()
            && matches!(kind, Kind::BFloat16 | Kind::Half)
            && head_dim % 8 == 0
            && head_dim <= 256
            && crate::engine::gpu::fast_paths::on(
                crate::engine::gpu::fast_paths::FastPath::FlashTarget,
            )
    }

    /// Causal attention within each document; `window` for sliding layers.
    // q [b, l, hq, d], k/v [b, l, hkv, d] -> [b, l, hq, d]
    pub fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        window: Option<i64>,
    ) -> Result<Tensor> {
        USED.store(true, Ordering::Relaxed);
        let flat = |x: &Tensor| x.flatten(0, 1).contiguous();
        let out = crate::engine::gpu::cuda::flash_varlen(
            &flat(q),
            &flat(k),
            &flat(v),
            &self.cu_seqlens,
            self.max_len,
            window,
        )?;
        Ok(out.view(q.size().as_slice()))
    }
}
