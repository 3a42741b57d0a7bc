//! libtorch's caching allocator on each CUDA device this process trains on, read through the
//! CUDA shim (`getDeviceStats`): bytes reserved and allocated, segments, and the device
//! allocations, frees and retries so far. Nothing on the CPU or in a build without the shim: the
//! figures are then absent, never zeros.

use crate::cuda_shim::{allocator_stats, AllocatorStats};

/// One device's statistics at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AllocatorSample {
    /// The device, `cuda:N` in this process.
    pub cuda: u32,
    pub stats: AllocatorStats,
}

/// The CUDA devices in `devices` (names as workers register them: `cuda:0`, `cpu`, …), each once,
/// in order.
pub fn cuda_indices<'a>(devices: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
    let mut out: Vec<u32> = devices
        .into_iter()
        .filter_map(|d| d.strip_prefix("cuda:")?.parse().ok())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The statistics of each of `devices` that can be read (none without the shim, or on a device
/// this process has not allocated on yet).
pub fn sample(devices: &[u32]) -> Vec<AllocatorSample> {
    if !crate::cuda_shim::AVAILABLE {
        return Vec::new();
    }
    devices
        .iter()
        .filter_map(|&cuda| {
            let stats = allocator_stats(cuda as usize).ok()?;
            Some(AllocatorSample { cuda, stats })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cuda_devices_count_each_once() {
        let names = ["cuda:1", "cpu", "cuda:0", "cuda:1", "cuda:x"];
        assert_eq!(cuda_indices(names), [0, 1]);
    }
}
