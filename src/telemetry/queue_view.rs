//! The queues as a snapshot shows them: depth, rates and waits over a window, the starving and
//! blocking flags held with hysteresis, and the verdict's inputs taken from them.

use super::names::Names;
use super::phase_recorder::ThreadInfo;
use super::queue::QueueProbe;
use super::snapshot::QueueView;
use super::verdict::{QueueWait, WaitShares, ENTER, EXIT};
use super::window::{QueueTick, Windows};

/// Starving / blocking flags per queue, with hysteresis.
#[derive(Debug, Default)]
pub struct QueueFlags(Vec<(bool, bool)>);

impl QueueFlags {
    /// Each queue over the last `ticks` ticks, with its depth history over `history_ticks`; a
    /// side's wait share is per thread of the role on that side (by `names`).
    pub fn views(
        &mut self,
        windows: &Windows,
        ticks: usize,
        history_ticks: usize,
        threads: &[ThreadInfo],
        queues: &[QueueProbe],
        names: &Names,
    ) -> Vec<QueueView> {
        let count_role = |role: &str| {
            threads
                .iter()
                .filter(|t| names.role(t.role) == role)
                .count()
                .max(1) as f64
        };
        if self.0.len() < queues.len() {
            self.0.resize(queues.len(), (false, false));
        }
        queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let w = windows.queue(i, ticks);
                let consumers = count_role(q.consumers());
                let producers = count_role(q.producers());
                let mut v = queue_view(
                    q,
                    &w,
                    windows.queue_history(i, history_ticks),
                    consumers,
                    producers,
                );
                let flags = &mut self.0[i];
                flags.0 = above(flags.0, v.consumer_wait_share);
                flags.1 = above(flags.1, v.producer_wait_share);
                (v.starving, v.blocking) = *flags;
                v
            })
            .collect()
    }
}

/// A flag with hysteresis: raised above `ENTER`, lowered below `EXIT`.
fn above(was: bool, share: f64) -> bool {
    share > if was { EXIT } else { ENTER }
}

fn share(ns: u64, span_ns: u64, threads: f64) -> f64 {
    if span_ns == 0 {
        return 0.0;
    }
    (ns as f64 / (span_ns as f64 * threads)).min(1.0)
}

fn queue_view(
    q: &QueueProbe,
    w: &QueueTick,
    history: Vec<f64>,
    consumers: f64,
    producers: f64,
) -> QueueView {
    let secs = w.span_ns as f64 / 1e9;
    let consumer_wait_share = share(w.pop_wait_ns, w.span_ns, consumers);
    let producer_wait_share = share(w.push_wait_ns, w.span_ns, producers);
    QueueView {
        name: q.name().to_string(),
        producers: q.producers().to_string(),
        consumers: q.consumers().to_string(),
        capacity: q.capacity(),
        depth: w.depth,
        min_depth: w.min_depth,
        max_depth: w.max_depth,
        mean_depth: w.mean_depth(),
        empty_share: share(w.empty_ns, w.span_ns, 1.0),
        full_share: share(w.full_ns, w.span_ns, 1.0),
        push_per_s: if secs > 0.0 {
            w.pushes as f64 / secs
        } else {
            0.0
        },
        pop_per_s: if secs > 0.0 {
            w.pops as f64 / secs
        } else {
            0.0
        },
        mean_age_ms: if w.pops > 0 {
            w.age_ns_sum as f64 / w.pops as f64 / 1e6
        } else {
            0.0
        },
        consumer_wait_share,
        producer_wait_share,
        history,
        // With hysteresis, by `QueueFlags::views`.
        starving: false,
        blocking: false,
    }
}

/// The verdict's inputs: the queues between stages, upstream first, found by who is on each
/// side (a queue whose sides name no stage of `names` is left out).
pub fn verdict_inputs(queues: &[QueueView], names: &Names) -> WaitShares {
    let mut chain: Vec<(u8, QueueWait)> = queues
        .iter()
        .filter_map(|q| {
            let producer = names.role_named(&q.producers)?;
            let consumer = names.role_named(&q.consumers)?;
            Some((
                producer.rank(),
                QueueWait {
                    consumer,
                    starved: q.consumer_wait_share,
                    blocked: q.producer_wait_share,
                },
            ))
        })
        .collect();
    chain.sort_by_key(|(rank, _)| *rank);
    WaitShares {
        chain: chain.into_iter().map(|(_, q)| q).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_is_raised_above_enter_and_lowered_only_below_exit() {
        let between = (ENTER + EXIT) / 2.0;
        assert!(!above(false, between), "not raised between the thresholds");
        assert!(above(false, ENTER + 0.01));
        assert!(above(true, between), "held between the thresholds");
        assert!(!above(true, EXIT - 0.01));
    }
}
