//! How AdamW keeps its moments (`--optimizer-states`): f32, or bf16 (half their memory: 4 bytes
//! a parameter less, 9.6 GiB at qwen3-32b's drafter) rounded stochastically. Rounded to nearest,
//! a bf16 second moment stalls: with beta2 = 0.999 a step changes it by 0.1%, under half of
//! bf16's spacing (2^-8 relative), so it never decays. Rounded up with the probability of the
//! remainder (the low 16 bits of the f32 against noise), each moment is unbiased.
//!
//! The noise is a hash of the element's index and the step (`noise_key`), not a generator's
//! state: a resumed run rounds as the first one would have, replicas holding one state round
//! alike, and the GPU's kernel (src/engine/cxx/optimizer_kernels.cpp) draws the same bits as
//! `round_stochastic` here.

use tch::{Kind, Tensor};

/// How the optimizer's moments are stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MomentPrecision {
    #[default]
    F32,
    /// bf16, rounded stochastically (the arithmetic stays f32).
    Bf16,
}

impl MomentPrecision {
    pub fn parse(s: &str) -> Option<MomentPrecision> {
        match s {
            "f32" => Some(MomentPrecision::F32),
            "bf16" => Some(MomentPrecision::Bf16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MomentPrecision::F32 => "f32",
            MomentPrecision::Bf16 => "bf16",
        }
    }

    /// Bytes both moments of one parameter take.
    pub fn bytes(self) -> f64 {
        match self {
            MomentPrecision::F32 => 8.0,
            MomentPrecision::Bf16 => 4.0,
        }
    }

    pub fn kind(self) -> Kind {
        match self {
            MomentPrecision::F32 => Kind::Float,
            MomentPrecision::Bf16 => Kind::BFloat16,
        }
    }
}

/// The key of step `step`'s noise for moment `which` (0: m, 1: v).
pub fn noise_key(step: i64, which: u32) -> u32 {
    (step as u32).wrapping_mul(2).wrapping_add(which)
}

const MASK32: i64 = 0xffff_ffff;

/// `h * c` modulo 2^32 for `h` holding values below 2^32 (int64), in halves so that no product
/// leaves int64.
fn mul32(h: &Tensor, c: u32) -> Tensor {
    let c = c as i64;
    let low = h.bitwise_and(0xffff) * c;
    let high = (h.bitwise_right_shift_tensor_scalar(16) * c).bitwise_and(0xffff) * 65536;
    (low + high).bitwise_and(MASK32)
}

fn xor_shift(h: &Tensor, by: i64) -> Tensor {
    h.bitwise_xor_tensor(&h.bitwise_right_shift_tensor_scalar(by))
}

/// MurmurHash3's 32-bit finaliser over int64 values below 2^32.
fn fmix32(h: &Tensor) -> Tensor {
    let h = mul32(&xor_shift(h, 16), 0x85eb_ca6b);
    let h = mul32(&xor_shift(&h, 13), 0xc2b2_ae35);
    xor_shift(&h, 16)
}

fn fmix32_host(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The noise of elements `offset..offset + n` under `key` (int64 values below 2^32), as the
/// kernel draws it: fmix32(low ^ fmix32(key ^ high * 0x9e3779b9)) of each index's halves.
fn noise(offset: i64, n: i64, key: u32, device: tch::Device) -> Tensor {
    let index = Tensor::arange_start(offset, offset + n, (Kind::Int64, device));
    let low = index.bitwise_and(MASK32);
    let inner = if offset + n <= 1 << 32 {
        // Every index's high half is 0: one value.
        Tensor::from(fmix32_host(key) as i64).to_device(device)
    } else {
        let high = index.bitwise_right_shift_tensor_scalar(32);
        fmix32(&mul32(&high, 0x9e37_79b9).bitwise_xor(key as i64))
    };
    fmix32(&low.bitwise_xor_tensor(&inner))
}

/// `x` (f32, flat: elements `offset..` of a buffer) rounded to bf16 stochastically: up with the
/// probability of what rounding down drops, the noise of each element's index in the buffer
/// under `key`. Values bf16 holds exactly stay; infinities and NaN round to nearest.
pub fn round_stochastic(x: &Tensor, key: u32, offset: i64) -> Tensor {
    let _g = tch::no_grad_guard();
    let n = x.numel() as i64;
    let bits = x
        .contiguous()
        .view_dtype(Kind::Int)
        .to_kind(Kind::Int64)
        .bitwise_and(MASK32);
    let r = noise(offset, n, key, x.device()).bitwise_and(0xffff);
    let up = (bits + r).bitwise_and(0xffff_0000_i64);
    // Back to int32's range, then read as f32: the low half is zero, so bf16 holds it.
    let signed = (&up - (1_i64 << 32) * up.ge(1_i64 << 31).to_kind(Kind::Int64)).to_kind(Kind::Int);
    let rounded = signed.view_dtype(Kind::Float).to_kind(Kind::BFloat16);
    rounded.where_self(&x.isfinite(), &x.to_kind(Kind::BFloat16))
}

#[cfg(test)]
pub(super) fn noise_for_tests(offset: i64, n: i64, key: u32) -> Vec<i64> {
    Vec::<i64>::try_from(noise(offset, n, key, tch::Device::Cpu)).unwrap()
}

#[cfg(test)]
pub(super) fn noise_host(index: u64, key: u32) -> u32 {
    let (low, high) = (index as u32, (index >> 32) as u32);
    fmix32_host(low ^ fmix32_host(key ^ high.wrapping_mul(0x9e37_79b9)))
}

#[cfg(test)]
mod tests;
