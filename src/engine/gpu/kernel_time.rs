//! Device time by kernel class over a window of a run (`bench engine --kernels`): libtorch's own
//! profiler (Kineto over CUPTI's activity records, src/engine/cxx/kernel_profile.cpp) records every
//! kernel, copy and set the process ran on a CUDA device between `KernelWindow::start` and `stop`;
//! each is sorted into a class by its name, so that a lever (the GEMMs, the attention kernels, the
//! elementwise work, the optimizer) is chosen by where the device time goes. The window covers
//! every worker on the card (the target's kernels and the drafter's alike). CUPTI takes one
//! subscriber a process: `--cupti` is off for such a run.

use anyhow::Result;

/// What a kernel does, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelClass {
    /// cuBLAS / cuBLASLt / CUTLASS matrix products.
    Gemm,
    /// Flash, cuDNN and our block attention kernels.
    Attention,
    /// Softmax and log-softmax kernels (the loss's over the vocabulary; a non-flash attention's
    /// softmax lands here too). The loss's max and sum reductions are `Reduce`.
    Loss,
    /// RMSNorm, LayerNorm, RoPE and the fused norm kernels.
    NormRope,
    /// The fused AdamW steps.
    Optimizer,
    /// Reductions (sums, maxima, means, the clipping norm).
    Reduce,
    /// Element-wise kernels (activations, adds, multiplies, masks).
    Elementwise,
    /// Copies (casts too: ATen runs them as `direct_copy_kernel`), memcpy and memset.
    Copy,
    /// NCCL's collectives (with several replicas; their time includes waiting for the peers).
    Comm,
    Other,
}

pub const CLASSES: [KernelClass; 10] = [
    KernelClass::Gemm,
    KernelClass::Attention,
    KernelClass::Loss,
    KernelClass::NormRope,
    KernelClass::Optimizer,
    KernelClass::Reduce,
    KernelClass::Elementwise,
    KernelClass::Copy,
    KernelClass::Comm,
    KernelClass::Other,
];

impl KernelClass {
    pub fn name(self) -> &'static str {
        match self {
            KernelClass::Gemm => "gemm",
            KernelClass::Attention => "attention",
            KernelClass::Loss => "loss",
            KernelClass::NormRope => "norm_rope",
            KernelClass::Optimizer => "optimizer",
            KernelClass::Reduce => "reduce",
            KernelClass::Elementwise => "elementwise",
            KernelClass::Copy => "copy",
            KernelClass::Comm => "comm",
            KernelClass::Other => "other",
        }
    }
}

/// The class of a kernel by its name (as CUPTI reports it, demangled). The first rule that
/// matches wins: NCCL first (its all-reduce is no reduction kernel), copies before element-wise
/// kernels (`direct_copy_kernel` is one), attention before GEMMs (flash kernels are CUTLASS
/// templates), reductions before norms (the clipping norm's `NormTwoOps` is a reduction).
pub fn classify(name: &str) -> KernelClass {
    let n = name.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| n.contains(w));
    if n.starts_with("nccl") || any(&["ncclkernel", "nccldevkernel"]) {
        KernelClass::Comm
    } else if n.starts_with("memcpy")
        || n.starts_with("memset")
        || any(&["copy_kernel", "batchedcopy"])
    {
        KernelClass::Copy
    } else if any(&["adam"]) {
        KernelClass::Optimizer
    } else if any(&["attention", "flash", "fmha", "sdpa"]) {
        KernelClass::Attention
    } else if any(&[
        "gemm",
        "gemv",
        "cutlass",
        "xmma",
        "nvjet",
        "cublas",
        "matmul",
        "dot_kernel",
    ]) {
        KernelClass::Gemm
    } else if any(&["softmax", "nll_loss", "cross_entropy", "logsumexp"]) {
        KernelClass::Loss
    } else if any(&["reduce", "lpnorm", "normtwo"]) {
        KernelClass::Reduce
    } else if any(&[
        "rms_norm",
        "rmsnorm",
        "layer_norm",
        "layernorm",
        "norm_rope",
        "rope",
        "rotary",
    ]) {
        KernelClass::NormRope
    } else if any(&["elementwise", "silu", "unrolled", "vectorized", "quantize"]) {
        KernelClass::Elementwise
    } else {
        KernelClass::Other
    }
}

/// Device time and count per class, and the kernels that took the most.
#[derive(Debug, Default)]
pub struct KernelTally {
    /// (count, device ns) per class, in `CLASSES` order.
    pub by_class: [(u64, u64); CLASSES.len()],
    /// (device ns, count) per kernel name.
    pub by_name: std::collections::HashMap<String, (u64, u64)>,
}

impl KernelTally {
    pub fn add(&mut self, name: &str, ns: u64) {
        let i = CLASSES
            .iter()
            .position(|&c| c == classify(name))
            .unwrap_or(CLASSES.len() - 1);
        self.by_class[i].0 += 1;
        self.by_class[i].1 += ns;
        let e = self.by_name.entry(name.to_string()).or_default();
        e.0 += ns;
        e.1 += 1;
    }

    pub fn total_ns(&self) -> u64 {
        self.by_class.iter().map(|c| c.1).sum()
    }

    /// `kernels: window=S steps device_ms/step=T gemm=X (P%) ...`, each class's device time a
    /// step of the window.
    pub fn classes_line(&self, steps: u64) -> String {
        let per_step = |ns: u64| ns as f64 / 1e6 / steps.max(1) as f64;
        let total = self.total_ns();
        let mut s = format!(
            "kernels: window={steps} steps device_ms/step={:.2}",
            per_step(total)
        );
        for (c, &(count, ns)) in CLASSES.iter().zip(&self.by_class) {
            if count > 0 {
                let share = 100.0 * ns as f64 / total.max(1) as f64;
                s.push_str(&format!(" {}={:.2} ({share:.0}%)", c.name(), per_step(ns)));
            }
        }
        s
    }

    /// The `n` kernels with the most device time: `ms/step count/step class name`.
    pub fn top_lines(&self, steps: u64, n: usize) -> Vec<String> {
        let mut names: Vec<_> = self.by_name.iter().collect();
        names.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
        names
            .into_iter()
            .take(n)
            .map(|(name, &(ns, count))| {
                let short: String = name.chars().take(110).collect();
                format!(
                    "kernel: {:.3} ms/step {:.1}/step {} {short}",
                    ns as f64 / 1e6 / steps.max(1) as f64,
                    count as f64 / steps.max(1) as f64,
                    classify(name).name()
                )
            })
            .collect()
    }
}

/// A profiling window: every kernel on every CUDA device from `start` to `stop`.
pub struct KernelWindow(());

impl KernelWindow {
    #[cfg(cuda_shim)]
    pub fn start() -> Result<KernelWindow> {
        crate::cuda_shim::check(
            unsafe { crate::cuda_shim::ffi::dflash_kernels_start() },
            "starting libtorch's profiler (Kineto over CUPTI)",
        )?;
        Ok(KernelWindow(()))
    }

    #[cfg(not(cuda_shim))]
    pub fn start() -> Result<KernelWindow> {
        anyhow::bail!(
            "--kernels reads CUDA kernels through the CUDA shim, which this build lacks: build \
             against the CUDA libtorch (docs/gpu.md)"
        )
    }

    /// Ends the window and sorts what ran in it.
    #[cfg(cuda_shim)]
    pub fn stop(self) -> Result<KernelTally> {
        use std::ffi::{c_char, c_void, CStr};
        extern "C" fn each(ctx: *mut c_void, name: *const c_char, ns: u64) {
            // SAFETY: `ctx` is the tally below, alive for the call; `name` a C string the shim
            // keeps for the call.
            let tally = unsafe { &mut *(ctx as *mut KernelTally) };
            let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
            tally.add(&name, ns);
        }
        let mut tally = KernelTally::default();
        let ctx = &mut tally as *mut KernelTally as *mut c_void;
        crate::cuda_shim::check(
            unsafe { crate::cuda_shim::ffi::dflash_kernels_stop(each, ctx) },
            "reading libtorch's profiler",
        )?;
        Ok(tally)
    }

    #[cfg(not(cuda_shim))]
    pub fn stop(self) -> Result<KernelTally> {
        Ok(KernelTally::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_fall_in_their_classes_by_name() {
        for (name, class) in [
            ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", KernelClass::Gemm),
            ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", KernelClass::Gemm),
            ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", KernelClass::Gemm),
            ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", KernelClass::Attention),
            ("block_attention_dkdv", KernelClass::Attention),
            ("adamw_bf16", KernelClass::Optimizer),
            ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>", KernelClass::Loss),
            ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float>>>", KernelClass::Reduce),
            ("add_rms_norm", KernelClass::NormRope),
            ("norm_rope", KernelClass::NormRope),
            ("silu_mul", KernelClass::Elementwise),
            // The FP8 target's row quantization (ours) and libtorch's row-wise scaled GEMM.
            ("quantize_rows_e4m3", KernelClass::Elementwise),
            ("void cutlass::device_kernel<at::cuda::detail::f8f8bf16_rowwise_kernel>", KernelClass::Gemm),
            ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", KernelClass::Elementwise),
            ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", KernelClass::Copy),
            ("Memcpy HtoD (Pinned -> Device)", KernelClass::Copy),
            ("Memset (Device)", KernelClass::Copy),
            ("void at::native::index_select_kernel<float>", KernelClass::Other),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", KernelClass::Comm),
            ("void at::native::normal_kernel<float>", KernelClass::Other),
            ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<LpNormFunctor<float, 2>>", KernelClass::Reduce),
            ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4>", KernelClass::Gemm),
            ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", KernelClass::NormRope),
        ] {
            assert_eq!(classify(name), class, "{name}");
        }
    }

    #[test]
    fn the_tally_reports_each_class_a_step_and_the_heaviest_kernels() {
        let mut t = KernelTally::default();
        t.add("nvjet_tst_a", 6_000_000);
        t.add("nvjet_tst_a", 6_000_000);
        t.add("block_attention_fwd", 4_000_000);
        t.add("silu_mul", 4_000_000);
        assert_eq!(t.total_ns(), 20_000_000);
        // Over 2 steps: 10 ms a step, GEMMs 6 (60%), attention 2 (20%), element-wise 2 (20%).
        let line = t.classes_line(2);
        assert_eq!(
            line,
            "kernels: window=2 steps device_ms/step=10.00 gemm=6.00 (60%) attention=2.00 (20%) \
             elementwise=2.00 (20%)"
        );
        let top = t.top_lines(2, 2);
        assert_eq!(
            top,
            [
                "kernel: 6.000 ms/step 1.0/step gemm nvjet_tst_a",
                "kernel: 2.000 ms/step 0.5/step attention block_attention_fwd",
            ]
        );
    }
}
