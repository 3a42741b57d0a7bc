//! `alloc_churn`: libtorch's caching allocator going back to the device every step (segments
//! mapped and unmapped, `cudaMalloc` / `cudaFree`), or retrying allocations after flushing its
//! cache. Judged per CUDA device over a sliding window, against the steps of the busiest thread
//! on that device; until every worker on the device is past warm-up at the window's start, the
//! cache is filling and nothing counts (a target that runs ahead while the drafter captures its
//! graphs is not yet steady); nor do the allocations of a sample interval in which a CUDA graph
//! capture began or ended, or of the one after (its memory pool comes from the device as the
//! capture runs, as the drafter's does for a new window plan).

use super::{steps_on, Candidate, Rule, Warnings, WARMUP_STEPS};
use crate::telemetry::snapshot::{AllocatorView, Snapshot};

/// One device at one snapshot.
#[derive(Clone, Copy, Debug)]
pub(super) struct AllocPoint {
    at_s: f64,
    /// Device allocations plus frees so far.
    churn: u64,
    retries: u64,
    /// Steps ended so far by the device's busiest worker.
    steps: u64,
    /// Steps ended so far by the device's least advanced worker.
    least_steps: u64,
    /// CUDA graph captures begun and ended so far.
    graphs: u64,
    /// Whether that count moved since the point before: a capture in the interval that ends
    /// here (kept with the point, so the interval after is known after the one before is gone).
    graph_moved: bool,
}

impl Warnings {
    pub(super) fn alloc_churn(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let window = self.config.alloc_window_s;
        for a in &s.allocator {
            let (least_steps, steps) = steps_on(s, a.cuda).unwrap_or((0, 0));
            let now = AllocPoint {
                at_s: s.elapsed_s,
                churn: a.device_allocs + a.device_frees,
                retries: a.alloc_retries,
                steps,
                least_steps,
                graphs: a.graph_events,
                graph_moved: false,
            };
            let seen = self.alloc.entry(a.cuda).or_default();
            let now = AllocPoint {
                graph_moved: seen.back().is_some_and(|p| p.graphs != now.graphs),
                ..now
            };
            seen.push_back(now);
            // Keep one point at or before the window's start: the baseline.
            while seen.len() > 1 && seen[1].at_s <= now.at_s - window {
                seen.pop_front();
            }
            let base = *seen.front().unwrap_or(&now);
            let counted = counted_churn(seen);
            if let Some(c) = self.alloc_candidate(a, base, now, counted) {
                out.push(c);
            }
        }
    }

    fn alloc_candidate(
        &self,
        a: &AllocatorView,
        base: AllocPoint,
        now: AllocPoint,
        (churn, steps, left_out_s): (u64, u64, f64),
    ) -> Option<Candidate> {
        let retries = now.retries.saturating_sub(base.retries);
        let per_step = churn as f64 / steps.max(1) as f64;
        let churning = base.least_steps >= WARMUP_STEPS
            && steps >= 2
            && per_step >= self.config.alloc_churn_per_step;
        if !churning && retries == 0 {
            return None;
        }
        let span = now.at_s - base.at_s;
        let over = match left_out_s {
            x if x > 0.05 => format!(
                "in {:.1} of the last {span:.0} s (the rest around graph captures)",
                span - x
            ),
            _ => format!("in the last {span:.0} s"),
        };
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let retried = match retries {
            0 => String::new(),
            1 => "; 1 allocation retry (a cache flush)".into(),
            n => format!("; {n} allocation retries (cache flushes)"),
        };
        let fix = if churning {
            "the cache gives memory back every step: remove torch.cuda.empty_cache() from the \
             training loop (Python); shapes that vary (shapes_vary) fit better with \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        } else {
            "the cache ran out and was flushed: a smaller batch or seq_len, or \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation"
        };
        Some(Candidate {
            rule: Rule::AllocChurn,
            subject: format!("cuda:{}", a.cuda),
            evidence: format!(
                "cuda:{}: {churn} device allocations and frees {over} over {steps} steps \
                 ({per_step:.1} a step){retried}; {} segments, {:.1} GiB reserved, {:.1} GiB \
                 allocated",
                a.cuda,
                a.segments,
                gib(a.reserved_bytes),
                gib(a.allocated_bytes)
            ),
            fix: fix.into(),
        })
    }
}

/// Device allocations plus frees, and steps of the busiest worker, over the window's points
/// (oldest first), leaving out each interval in which a CUDA graph capture began or ended and
/// the one after: a graph's pool comes from the device as the capture runs (the engine's own,
/// not churn), and what a sample reads late lands in the next interval. Also the seconds left
/// out.
fn counted_churn(points: &std::collections::VecDeque<AllocPoint>) -> (u64, u64, f64) {
    let (mut churn, mut steps, mut left_out_s) = (0, 0, 0.0);
    for i in 1..points.len() {
        if points[i].graph_moved || points[i - 1].graph_moved {
            left_out_s += points[i].at_s - points[i - 1].at_s;
            continue;
        }
        churn += points[i].churn.saturating_sub(points[i - 1].churn);
        steps += points[i].steps.saturating_sub(points[i - 1].steps);
    }
    (churn, steps, left_out_s)
}
