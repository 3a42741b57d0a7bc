//! FP8 for the frozen target (`--target-precision fp8`): each linear layer's weight in e4m3 with a
//! scale per output channel, quantized once at load; each GEMM's input rows in e4m3 with a scale
//! per token, quantized as they come; the GEMM in FP8 with f32 sums, written in bf16. The residual
//! stream, the norms, RoPE, attention and the captured states stay in bf16; the embedding and the
//! lm head are not touched (the drafter reads them as they are).
//!
//! On CUDA the GEMM is libtorch's row-wise scaled matmul (FP8 tensor cores: compute capability
//! 8.9 and up) and the rows are quantized by a kernel of ours (src/engine/gpu/cuda/fp8_kernels.rs)
//! or, where it cannot run, by the ops of `quantize_rows_ops`, which round alike. Elsewhere (the
//! CPU) the same e4m3 values are multiplied in f32: the numbers of FP8, for checking its effect,
//! at no gain in speed.

use tch::{Device, Kind, TchError, Tensor};

/// The largest finite e4m3 value.
pub const E4M3_MAX: f64 = 448.0;
/// The least magnitude a scale is taken from, so that a row of zeros gets a finite one.
pub const MIN_AMAX: f64 = 1e-12;

/// How the frozen target's linear layers compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetPrecision {
    /// The weights as loaded (bf16 on a GPU, f32 on the CPU).
    #[default]
    Bf16,
    /// e4m3 weights and inputs, scaled per channel and per token.
    Fp8,
}

impl TargetPrecision {
    pub fn parse(s: &str) -> Option<TargetPrecision> {
        match s {
            "bf16" => Some(TargetPrecision::Bf16),
            "fp8" => Some(TargetPrecision::Fp8),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TargetPrecision::Bf16 => "bf16",
            TargetPrecision::Fp8 => "fp8",
        }
    }

    /// Bytes a target layer's weight takes on a GPU (an FP8 one's scales are one f32 a row).
    pub fn weight_bytes(self) -> f64 {
        match self {
            TargetPrecision::Bf16 => 2.0,
            TargetPrecision::Fp8 => 1.0,
        }
    }
}

/// A frozen linear layer's weight [out, in] in e4m3 and its scale per output channel (f32
/// [1, out]): weight ≈ q * scale^T.
#[derive(Debug)]
pub struct Fp8Weight {
    q: Tensor,
    scale: Tensor,
}

impl Fp8Weight {
    /// Each output channel (row) of `w` [out, in] over its largest magnitude times `E4M3_MAX`.
    pub fn quantize(w: &Tensor) -> Fp8Weight {
        let _g = tch::no_grad_guard();
        let (q, scale) = quantize_rows_ops(&w.detach());
        Fp8Weight {
            q,
            scale: scale.reshape([1, -1]),
        }
    }

    /// Whether a weight [out, in] on its device runs as FP8 at full speed: anywhere but CUDA (the
    /// CPU emulates all), and on CUDA where both sides are multiples of 16, as the tensor-core
    /// GEMM needs (another layer keeps its bf16 weight: no slow path per call).
    pub fn fits(w: &Tensor) -> bool {
        let size = w.size();
        !w.device().is_cuda() || (size.len() == 2 && size[0] % 16 == 0 && size[1] % 16 == 0)
    }

    /// Output channels `at..at + n` (a view of the same e4m3 values).
    pub fn rows(&self, at: i64, n: i64) -> Fp8Weight {
        Fp8Weight {
            q: self.q.narrow(0, at, n),
            scale: self.scale.narrow(1, at, n).contiguous(),
        }
    }

    /// The weight as `kind` again (what the GEMM multiplies by), for the tests' f32 sums.
    #[cfg(test)]
    pub fn dequantized(&self, kind: Kind) -> Tensor {
        (self.q.to_kind(Kind::Float) * self.scale.tr()).to_kind(kind)
    }

    /// libtorch's row-wise scaled GEMM of rows `xq` (e4m3, [rows, in]) with their scales
    /// (f32 [rows, 1]) by this weight, written in `out`.
    fn scaled_mm(&self, xq: &Tensor, x_scale: &Tensor, out: Kind) -> Result<Tensor, TchError> {
        xq.f_internal_scaled_mm(
            &self.q.tr(),
            x_scale,
            &self.scale,
            None::<Tensor>,
            None::<Tensor>,
            out,
            false,
        )
    }

    /// `x W^T` [.., out] for `x` [.., in], in `x`'s dtype.
    pub fn matmul(&self, x: &Tensor) -> Tensor {
        let mut shape = x.size();
        let inp = shape.pop().unwrap_or(0);
        let out = self.q.size()[0];
        let rows = x.reshape([-1, inp]);
        let (xq, x_scale) = quantize_rows(&rows);
        let tensor_cores = x.device().is_cuda() && inp % 16 == 0 && out % 16 == 0;
        let y = if tensor_cores {
            // `check_device` ran this GEMM when the target was built: a failure here is a bug.
            self.scaled_mm(&xq, &x_scale, x.kind())
                .unwrap_or_else(|e| panic!("the FP8 GEMM failed: {e}"))
        } else {
            // The same products and scales, summed in f32 (the CPU; on CUDA only a layer that
            // `fits` refused could come here, and none is quantized).
            let sums = xq
                .to_kind(Kind::Float)
                .matmul(&self.q.to_kind(Kind::Float).tr());
            (sums * x_scale * &self.scale).to_kind(x.kind())
        };
        shape.push(out);
        y.reshape(shape)
    }
}

/// Each row of `x` [rows, cols] in e4m3 and its scale (f32 [rows, 1]), by our kernel where it
/// runs, else by `quantize_rows_ops`.
pub fn quantize_rows(x: &Tensor) -> (Tensor, Tensor) {
    crate::engine::gpu::cuda::quantize_rows_e4m3(x, MIN_AMAX, E4M3_MAX)
        .unwrap_or_else(|| quantize_rows_ops(x))
}

/// `quantize_rows` in libtorch's ops: scale = max(amax, MIN_AMAX) / E4M3_MAX and x / scale
/// rounded to nearest even, saturated to the finite range; in f32, each a division of tensors
/// (no reciprocal taken), as the kernel divides.
pub fn quantize_rows_ops(x: &Tensor) -> (Tensor, Tensor) {
    let x = x.to_kind(Kind::Float);
    // Made on the device (a copy from the host could not be captured in a CUDA graph).
    let top = Tensor::full([1], E4M3_MAX, (Kind::Float, x.device()));
    let amax = x.abs().amax([-1], true).clamp_min(MIN_AMAX as f32 as f64);
    let scale = amax / &top;
    let q = (x / &scale)
        .clamp(-E4M3_MAX, E4M3_MAX)
        .to_kind(Kind::Float8e4m3fn);
    (q, scale)
}

/// Whether `device` runs FP8 GEMMs (the CPU emulates them): one small scaled matmul, and on
/// failure a sentence naming the flag and the fix.
pub fn check_device(device: Device) -> anyhow::Result<()> {
    if !device.is_cuda() {
        return Ok(());
    }
    let _g = tch::no_grad_guard();
    let w = Fp8Weight::quantize(&Tensor::ones([16, 16], (Kind::BFloat16, device)));
    let x = Tensor::ones([16, 16], (Kind::BFloat16, device));
    let (xq, x_scale) = quantize_rows_ops(&x);
    w.scaled_mm(&xq, &x_scale, Kind::BFloat16)
        .map(|_| ())
        .map_err(|e| {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or("").to_string();
            anyhow::anyhow!(
                "--target-precision fp8: {device:?} cannot run FP8 matmuls (they need FP8 tensor \
             cores: compute capability 8.9 or newer, e.g. an L4, H100 or H200; libtorch says: \
             {first}); leave the flag out to run the target in bf16"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel_gap(a: &Tensor, b: &Tensor) -> f64 {
        let d = (a - b).to_kind(Kind::Float).norm();
        f64::try_from(d / b.to_kind(Kind::Float).norm()).unwrap()
    }

    #[test]
    fn rows_take_their_largest_magnitude_to_the_top_of_e4m3() {
        let x = Tensor::from_slice(&[1.0f32, -2.0, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0]).reshape([2, 4]);
        let (q, scale) = quantize_rows_ops(&x);
        assert_eq!(q.kind(), Kind::Float8e4m3fn);
        let scale: Vec<f32> = Vec::try_from(scale.reshape([-1])).unwrap();
        assert_eq!(scale[0], 2.0 / 448.0);
        // A row of zeros keeps a finite scale and comes back zeros.
        assert_eq!(scale[1], (MIN_AMAX as f32) / 448.0);
        let back: Vec<f32> = Vec::try_from(q.to_kind(Kind::Float).reshape([-1])).unwrap();
        assert_eq!(back, [224.0, -448.0, 112.0, 56.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_with_three_mantissa_bits() {
        // Between 16 and 32 e4m3 steps by 2: 17 is a tie (to 16, the even mantissa), 19 one (to
        // 20), 17.5 goes up. With the row's largest at 448 the scale is 1.
        let x = Tensor::from_slice(&[17.0f32, 19.0, 17.5, 448.0]).reshape([1, 4]);
        let (q, _) = quantize_rows_ops(&x);
        let back: Vec<f32> = Vec::try_from(q.to_kind(Kind::Float).reshape([-1])).unwrap();
        assert_eq!(back, [16.0, 20.0, 18.0, 448.0]);
    }

    #[test]
    fn an_fp8_matmul_is_the_matmul_within_e4m3_rounding() {
        tch::manual_seed(3);
        let w = Tensor::randn([48, 64], (Kind::Float, Device::Cpu)) * 0.05;
        let x = Tensor::randn([2, 5, 64], (Kind::Float, Device::Cpu));
        let exact = x.matmul(&w.tr());
        let fp8 = Fp8Weight::quantize(&w);
        let y = fp8.matmul(&x);
        assert_eq!(y.size(), [2, 5, 48]);
        // Two e4m3 roundings (3 mantissa bits: up to 1/16 relative each, ~2.5% RMS on a sum).
        let gap = rel_gap(&y, &exact);
        assert!(gap > 1e-3 && gap < 0.06, "relative gap {gap}");
        // It multiplies exactly the quantized values: the dequantized weight by the dequantized
        // rows gives the same sums.
        let (xq, xs) = quantize_rows_ops(&x.reshape([-1, 64]));
        let deq = (xq.to_kind(Kind::Float) * xs).matmul(&fp8.dequantized(Kind::Float).tr());
        assert!(rel_gap(&y.reshape([-1, 48]), &deq) < 1e-6);
    }

    #[test]
    fn a_weight_s_rows_are_views_of_its_channels() {
        tch::manual_seed(4);
        let w = Tensor::randn([32, 16], (Kind::Float, Device::Cpu));
        let fp8 = Fp8Weight::quantize(&w);
        let part = fp8.rows(8, 16);
        let x = Tensor::randn([3, 16], (Kind::Float, Device::Cpu));
        assert!(part.matmul(&x).equal(&fp8.matmul(&x).narrow(1, 8, 16)));
    }

    /// On a GPU: the row kernel gives the ops' e4m3 values and scales to the bit (rows of one
    /// block's 2,048 elements and of several, a row of zeros among them), and the FP8 tensor-core
    /// GEMM gives the f32 sums of the same values within its bf16 output's rounding.
    #[test]
    #[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
    fn the_row_kernel_and_the_fp8_gemm_give_the_ops_on_cuda() {
        let Some(dev) = crate::engine::gpu::cuda::cuda_or_skip("the FP8 kernel") else {
            return;
        };
        tch::manual_seed(12);
        for cols in [1000, 4096, 12288] {
            let x = (Tensor::randn([37, cols], (Kind::Float, dev)) * 3.0).to_kind(Kind::BFloat16);
            let _ = x.get(5).zero_();
            let (q, scale) = crate::engine::gpu::cuda::quantize_rows_e4m3(&x, MIN_AMAX, E4M3_MAX)
                .unwrap_or_else(|| {
                    panic!(
                        "the kernel did not run: {}",
                        crate::engine::gpu::cuda::fp8_kernel_state()
                    )
                });
            let (q_ops, scale_ops) = quantize_rows_ops(&x);
            assert!(scale.equal(&scale_ops), "{cols} wide: the scales differ");
            let bits = |t: &Tensor| t.view_dtype(Kind::Uint8);
            let apart = i64::try_from(bits(&q).ne_tensor(&bits(&q_ops)).sum(Kind::Int64)).unwrap();
            assert_eq!(apart, 0, "{cols} wide: {apart} e4m3 values differ");
        }
        let w = (Tensor::randn([768, 4096], (Kind::Float, dev)) * 0.02).to_kind(Kind::BFloat16);
        let x = Tensor::randn([3, 50, 4096], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let fp8 = Fp8Weight::quantize(&w);
        let y = fp8.matmul(&x);
        assert_eq!((y.size(), y.kind()), (vec![3, 50, 768], Kind::BFloat16));
        let (xq, xs) = quantize_rows_ops(&x.reshape([-1, 4096]));
        let sums = (xq.to_kind(Kind::Float) * xs).matmul(&fp8.dequantized(Kind::Float).tr());
        let gap = rel_gap(&y.reshape([-1, 768]), &sums);
        assert!(gap < 4e-3, "the FP8 GEMM is {gap} from the f32 sums");
        // A view of some channels (q, k, v of a fused projection) multiplies as they did.
        let part = fp8.rows(256, 512).matmul(&x).reshape([-1, 512]);
        let gap = rel_gap(&part, &sums.narrow(1, 256, 512));
        assert!(gap < 4e-3, "a view of channels is {gap} from the f32 sums");
        check_device(dev).expect("an FP8 GPU");
    }

    #[test]
    fn precision_names_round_trip() {
        for p in [TargetPrecision::Bf16, TargetPrecision::Fp8] {
            assert_eq!(TargetPrecision::parse(p.name()), Some(p));
        }
        assert_eq!(TargetPrecision::parse("fp16"), None);
    }
}
