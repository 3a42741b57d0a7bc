//! `gpu_idle`: a GPU that sits idle while work is queued for a worker on it. NVML's utilisation
//! is a sampled figure that spikes whenever a burst of kernels lands (a host-bound drafter reads
//! 0, 0, 49, 0 … a second apart on an H200), so the rule judges the mean over its window
//! (`gpu_idle_s`), not each sample: one spike does not start the wait over. Its window opens
//! once every worker on the GPU is past its warm-up steps (`WARMUP_STEPS`): before that the GPU
//! idles while models load, kernels are built and graphs captured, with batches already queued,
//! which is start-up, not a host-bound stage.

use super::{steps_on, Candidate, Rule, Warnings, WARMUP_STEPS};
use crate::telemetry::snapshot::{GpuPanel, Snapshot};
use std::collections::VecDeque;

/// One device's utilisation samples over the window, oldest first: (elapsed s, percent).
pub(super) type UtilSamples = VecDeque<(f64, u32)>;

impl Warnings {
    pub(super) fn gpu_idle(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let GpuPanel::Present(gpus) = &s.gpus else {
            return;
        };
        let window = self.config.gpu_idle_s;
        for g in gpus {
            let Some(n) = g.cuda else { continue };
            let seen = self.gpu_util.entry(n).or_default();
            if steps_on(s, n).is_none_or(|(least, _)| least < WARMUP_STEPS) {
                seen.clear();
                continue;
            }
            let device = format!("cuda:{n}");
            seen.push_back((s.elapsed_s, g.util_pct));
            // Keep one sample at or before the window's start: the window is then covered.
            while seen.len() > 1 && seen[1].0 <= s.elapsed_s - window {
                seen.pop_front();
            }
            let covered = seen[0].0 <= s.elapsed_s - window + 1e-9;
            let mean = seen.iter().map(|(_, u)| *u as f64).sum::<f64>() / seen.len() as f64;
            if !covered || mean >= self.config.gpu_idle_pct {
                continue;
            }
            // A worker on this GPU with work waiting in its input queue.
            let waiting = s
                .threads
                .iter()
                .filter(|t| t.device == device)
                .find_map(|t| {
                    let q = s
                        .queues
                        .iter()
                        .find(|q| q.consumers == s.names.role(t.role) && q.depth > 0)?;
                    Some((t, q))
                });
            let Some((t, q)) = waiting else { continue };
            out.push(Candidate {
                rule: Rule::GpuIdle,
                subject: device.clone(),
                evidence: format!(
                    "{device} at {mean:.0}% utilisation on average over {window:.0} s while \
                     queue `{}` holds {}/{} for {} (in {})",
                    q.name,
                    q.depth,
                    q.capacity,
                    t.name,
                    s.names.phase(t.phase)
                ),
                fix: format!(
                    "{} is host-bound: look at its phases (view 2) for launch overhead or host \
                     syncs; a larger batch or CUDA graphs keep the GPU fed",
                    t.name
                ),
            });
        }
    }
}
