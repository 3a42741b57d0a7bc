//! The pipeline's checks of memory: before anything is built, whether the host has the memory the
//! run needs at least (the weights of a side on the CPU); after
//! libtorch's out-of-memory, the note of what the shapes need against the GPU and the memory
//! lever that would fit it.

use crate::engine::model::memory::GIB;
use crate::engine::spec::PipelineSpec;
use tch::Device;

/// For libtorch's out-of-memory: what the shapes need against the smallest GPU the run uses and
/// the memory levers not set (`PipelineSpec::memory_note`; on the CPU what the shapes need and
/// the first lever that lowers it). Computed at start, while the GPUs can still be asked; said
/// after a build's out-of-memory and a worker's, here and to a job's other ranks.
pub(super) fn memory_note(cfg: &PipelineSpec) -> String {
    let cuda = |d: &Device| match d {
        Device::Cuda(i) => Some(*i),
        _ => None,
    };
    let gpus: Vec<usize> = cfg
        .target_devices
        .iter()
        .chain(&cfg.drafter_devices)
        .filter_map(cuda)
        .collect();
    let card = gpus
        .iter()
        .filter_map(|&i| crate::cuda_shim::memory_total(i).ok())
        .min();
    // The target's FP8 GEMMs, on every target device, from compute capability 8.9 on
    // (src/engine/model/fp8.rs).
    let fp8 = cfg.target_devices.iter().all(|d| {
        cuda(d).is_some_and(|i| crate::cuda_shim::compute_capability(i).is_ok_and(|c| c >= (8, 9)))
    });
    let card_gib = card.map(|b| b as f64 / GIB);
    cfg.memory_note(card_gib, fp8)
}

/// Host memory available now, GiB: /proc/meminfo's MemAvailable and SwapFree, within the
/// cgroup's limit where there is one (v2's memory.max less memory.current); None where
/// /proc/meminfo cannot be read.
pub(super) fn host_available_gib() -> Option<f64> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let meminfo = read("/proc/meminfo")?;
    let max = read("/sys/fs/cgroup/memory.max");
    let current = read("/sys/fs/cgroup/memory.current");
    available_from(&meminfo, max.as_deref(), current.as_deref())
}

/// `host_available_gib` from the files' text.
fn available_from(
    meminfo: &str,
    cgroup_max: Option<&str>,
    cgroup_current: Option<&str>,
) -> Option<f64> {
    let kib = |key: &str| -> Option<f64> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let host = (kib("MemAvailable:")? + kib("SwapFree:").unwrap_or(0.0)) * 1024.0;
    let limit = match (cgroup_max, cgroup_current) {
        (Some(max), Some(current)) => {
            match (max.trim().parse::<f64>(), current.trim().parse::<f64>()) {
                (Ok(max), Ok(current)) => Some((max - current).max(0.0)),
                _ => None, // "max": no limit
            }
        }
        _ => None,
    };
    let bytes = limit.map_or(host, |l| l.min(host));
    Some(bytes / GIB)
}

/// `error` with the memory note after it where it is libtorch's out-of-memory; None otherwise.
pub(super) fn with_memory_note(error: &str, note: &str) -> Option<String> {
    error
        .contains("out of memory")
        .then(|| format!("{error} ({note})"))
}

#[cfg(test)]
mod tests {
    use super::available_from;

    /// Free memory and swap, within the cgroup's limit where it has one.
    #[test]
    fn the_host_memory_available_counts_swap_and_the_cgroup_limit() {
        let meminfo = "MemTotal: 24000000 kB\nMemAvailable: 2097152 kB\nSwapFree: 1048576 kB\n";
        assert_eq!(available_from(meminfo, None, None), Some(3.0));
        assert_eq!(
            available_from(meminfo, Some("max\n"), Some("1000\n")),
            Some(3.0)
        );
        let gib = (1u64 << 30).to_string();
        let limit = (3 * (1u64 << 30)).to_string();
        assert_eq!(available_from(meminfo, Some(&limit), Some(&gib)), Some(2.0));
        assert_eq!(
            available_from("MemAvailable: 1048576 kB\n", None, None),
            Some(1.0)
        );
        assert_eq!(available_from("MemTotal: 5 kB\n", None, None), None);
    }
}
