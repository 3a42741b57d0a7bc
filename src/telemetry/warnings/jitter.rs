//! `queue_jitter`: a queue too small for its producer's jitter. Over the window
//! (`jitter_window_s`) it ran empty with its consumers waiting and full with its producers
//! waiting, and each side lost at least `jitter_wait_share` of its time over the window to it:
//! the share is the window's mean, not one second's, so that one hiccup of a loaded host (a
//! producer descheduled for half a second once) is not a queue too small, while a producer that
//! works in bursts is. The window opens once every thread on either side of the queue is past
//! its warm-up steps (`WARMUP_STEPS`): at start the consumers wait on an empty queue while the
//! producers make their first items, and then it fills, which is start-up, not jitter.

use super::{Candidate, Rule, Warnings, WARMUP_STEPS};
use crate::telemetry::snapshot::{QueueView, Snapshot, ThreadState};
use std::collections::VecDeque;

/// One queue's samples over the window, oldest first.
pub(super) type JitterSamples = VecDeque<Sample>;

/// A snapshot's view of one queue.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    t: f64,
    /// It ran empty with its consumers waiting.
    empty: bool,
    /// It ran full with its producers waiting.
    full: bool,
    consumer_wait: f64,
    producer_wait: f64,
}

/// The fewest steps ended by a thread on either side of `q` (threads that exited left out);
/// None where no thread of either side is seen (a merged view's names): no warm-up to wait for.
fn least_steps(s: &Snapshot, q: &QueueView) -> Option<u64> {
    s.threads
        .iter()
        .filter(|t| t.state != ThreadState::Exited)
        .filter(|t| {
            let role = s.names.role(t.role);
            role == q.consumers || role == q.producers
        })
        .map(|t| t.run.steps)
        .min()
}

impl Warnings {
    pub(super) fn queue_jitter(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let now = s.elapsed_s;
        let window = self.config.jitter_window_s;
        let share = self.config.jitter_wait_share;
        for q in &s.queues {
            let seen = self.jitter.entry(q.name.clone()).or_default();
            if least_steps(s, q).is_some_and(|n| n < WARMUP_STEPS) || s.stall.is_some() {
                seen.clear();
                continue;
            }
            seen.push_back(Sample {
                t: now,
                empty: q.min_depth == 0 && q.consumer_wait_share > 0.0,
                full: q.capacity > 0 && q.max_depth >= q.capacity && q.producer_wait_share > 0.0,
                consumer_wait: q.consumer_wait_share,
                producer_wait: q.producer_wait_share,
            });
            // Keep one sample at or before the window's start: the window is then covered.
            while seen.len() > 1 && seen[1].t <= now - window {
                seen.pop_front();
            }
            let covered = seen[0].t <= now - window + 1e-9;
            let n = seen.len() as f64;
            let consumers = seen.iter().map(|p| p.consumer_wait).sum::<f64>() / n;
            let producers = seen.iter().map(|p| p.producer_wait).sum::<f64>() / n;
            let both = seen.iter().any(|p| p.empty) && seen.iter().any(|p| p.full);
            if !covered || !both || consumers < share || producers < share {
                continue;
            }
            let key = match q.name.as_str() {
                "batch" | "hs" => format!("`{}_queue` in the TOML config", q.name),
                _ => "its capacity".to_string(),
            };
            out.push(Candidate {
                rule: Rule::QueueJitter,
                subject: q.name.clone(),
                evidence: format!(
                    "queue `{}` ({} slots) ran empty and full within {window:.0} s, its {} \
                     waiting {:.0}% and its {} {:.0}% of that time",
                    q.name,
                    q.capacity,
                    q.consumers,
                    consumers * 100.0,
                    q.producers,
                    producers * 100.0,
                ),
                fix: format!(
                    "the queue is too small for the {} side's jitter: raise {key} to {}",
                    q.producers,
                    (q.capacity * 2).max(2)
                ),
            });
        }
    }
}
