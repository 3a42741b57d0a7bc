//! The caching allocator's figures per CUDA device, as the snapshot carries them: read at each
//! hub tick (`probe::allocator`), or sent by a watched process in its samples, with the device
//! allocations, frees and retries turned into rates over the last second of samples.

use super::phase_recorder::ThreadInfo;
use super::snapshot::AllocatorView;
use crate::probe::allocator::{cuda_indices, sample, AllocatorSample};
use std::collections::VecDeque;

/// Samples kept for the rates: a second of hub ticks.
const RATE_SAMPLES: usize = 11;

/// Recent samples, oldest first, each with its time (ns).
#[derive(Debug, Default)]
pub struct AllocatorTrack {
    recent: VecDeque<(u64, Vec<AllocatorSample>)>,
}

impl AllocatorTrack {
    /// Reads the allocator on the CUDA devices of `threads` at `now_ns`: the views for the
    /// snapshot (empty where nothing can be read).
    pub fn sample(&mut self, threads: &[ThreadInfo], now_ns: u64) -> Vec<AllocatorView> {
        self.update(now_ns, read(threads))
    }

    /// `push`, where a moment with no samples (nothing read, or a producer that sent none) has
    /// no views and leaves the kept samples as they are.
    pub fn update(&mut self, now_ns: u64, samples: Vec<AllocatorSample>) -> Vec<AllocatorView> {
        if samples.is_empty() {
            return Vec::new();
        }
        self.push(now_ns, samples)
    }

    /// Adds the samples read at `now_ns` and returns their views, rated against the oldest kept.
    pub fn push(&mut self, now_ns: u64, samples: Vec<AllocatorSample>) -> Vec<AllocatorView> {
        self.recent.push_back((now_ns, samples));
        while self.recent.len() > RATE_SAMPLES {
            self.recent.pop_front();
        }
        let (then_ns, before) = &self.recent[0];
        let (_, now) = &self.recent[self.recent.len() - 1];
        let dt_s = now_ns.saturating_sub(*then_ns) as f64 / 1e9;
        now.iter()
            .map(|s| {
                let prev = before.iter().find(|b| b.cuda == s.cuda);
                view(s, prev, dt_s)
            })
            .collect()
    }
}

/// The allocator on the CUDA devices of `threads`, where it can be read (none on the CPU or
/// without the shim).
pub fn read(threads: &[ThreadInfo]) -> Vec<AllocatorSample> {
    let devices = cuda_indices(threads.iter().map(|t| t.device.as_str()));
    if devices.is_empty() {
        return Vec::new();
    }
    sample(&devices)
}

/// One device's view; rates 0 until a second sample of it is kept.
fn view(s: &AllocatorSample, prev: Option<&AllocatorSample>, dt_s: f64) -> AllocatorView {
    let st = &s.stats;
    let churn = |x: &AllocatorSample| x.stats.device_allocs + x.stats.device_frees;
    let rate = |now: u64, then: u64| {
        if dt_s > 0.0 {
            now.saturating_sub(then) as f64 / dt_s
        } else {
            0.0
        }
    };
    let (churn_per_s, retries_per_s) = match prev {
        Some(p) => (
            rate(churn(s), churn(p)),
            rate(st.alloc_retries, p.stats.alloc_retries),
        ),
        None => (0.0, 0.0),
    };
    AllocatorView {
        cuda: s.cuda,
        reserved_bytes: st.reserved_bytes,
        allocated_bytes: st.allocated_bytes,
        segments: st.segments,
        device_allocs: st.device_allocs,
        device_frees: st.device_frees,
        alloc_retries: st.alloc_retries,
        churn_per_s,
        retries_per_s,
        graph_events: st.graph_events,
        host: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda_shim::AllocatorStats;

    fn at(allocs: u64, frees: u64, retries: u64) -> Vec<AllocatorSample> {
        vec![AllocatorSample {
            cuda: 0,
            stats: AllocatorStats {
                reserved_bytes: 4 << 30,
                segments: 12,
                device_allocs: allocs,
                device_frees: frees,
                alloc_retries: retries,
                ..Default::default()
            },
        }]
    }

    #[test]
    fn allocations_and_frees_become_a_rate_over_the_last_second() {
        let mut t = AllocatorTrack::default();
        let first = t.push(0, at(100, 90, 0));
        assert_eq!((first[0].churn_per_s, first[0].segments), (0.0, 12));
        // 20 ticks of 100 ms, 3 allocations and 3 frees each, a retry every tick.
        let mut last = Vec::new();
        for k in 1..=20u64 {
            last = t.push(k * 100_000_000, at(100 + 3 * k, 90 + 3 * k, k));
        }
        let v = &last[0];
        assert!((v.churn_per_s - 60.0).abs() < 1e-9, "{v:?}");
        assert!((v.retries_per_s - 10.0).abs() < 1e-9, "{v:?}");
        assert_eq!((v.device_allocs, v.device_frees), (160, 150));
    }

    #[test]
    fn a_moment_without_samples_has_no_views_and_keeps_the_rates_going() {
        let mut t = AllocatorTrack::default();
        t.update(0, at(100, 90, 0));
        assert!(t.update(100_000_000, Vec::new()).is_empty());
        let v = t.update(1_000_000_000, at(110, 100, 1));
        assert!((v[0].churn_per_s - 20.0).abs() < 1e-9, "{v:?}");
        assert!((v[0].retries_per_s - 1.0).abs() < 1e-9, "{v:?}");
    }

    #[test]
    fn no_cuda_device_reads_nothing() {
        let mut t = AllocatorTrack::default();
        assert!(t.sample(&[], 0).is_empty());
    }
}
