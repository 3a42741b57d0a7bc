//! Placement advice: how to split target and drafter workers over the GPUs at hand, from the
//! ratio of the two stages' costs per batch — measured (a running pipeline's busy time per step,
//! waits left out) or, before anything ran, estimated from the models' FLOPs (the engine's
//! src/engine/model/flops.rs gives that ratio).
//!
//! With `G` GPUs and a drafter stage `r` times the target's, `t` GPUs of targets and `G - t` of
//! drafters move min(t, (G - t) / r) batches per target-time; a target and a drafter sharing
//! every GPU move G / (1 + r). Sharing is never slower in this model, so a split is advised only
//! where it comes within 5% of it (fewer replicas to average, no two workers on one GPU).

use super::{Role, Snapshot};

/// A split within this share of sharing every GPU is preferred.
const SPLIT_WITHIN: f64 = 0.95;

/// GiB kept free on a card beyond the estimate (CUDA's context, the allocator's slack).
const CARD_MARGIN_GIB: f64 = 2.0;

#[derive(Clone, Debug, PartialEq)]
pub struct Advice {
    /// Drafter cost per batch over the target's.
    pub ratio: f64,
    pub gpus: usize,
    /// GPUs of targets and of drafters; `None`: a target and a drafter on every GPU.
    pub split: Option<(usize, usize)>,
    /// Where the memory estimate says a target and a drafter do not fit one card together.
    pub crowded: Option<Room>,
}

/// The memory a target and a drafter need (estimated from the shapes,
/// src/engine/model/memory.rs) against the smallest card's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Room {
    /// GiB of a target and a drafter on one card.
    pub together_gib: f64,
    /// GiB of the larger of the two on a card of its own.
    pub apart_gib: f64,
    pub card_gib: f64,
}

impl Room {
    fn holds(&self, gib: f64) -> bool {
        gib <= self.card_gib - CARD_MARGIN_GIB
    }
}

/// The advice for `gpus` GPUs (at least 1) and a drafter stage `ratio` times the target's.
pub fn advise(ratio: f64, gpus: usize) -> Advice {
    advise_in(ratio, gpus, None)
}

/// As `advise`, on cards of `room`: where a target and a drafter do not fit one card together,
/// the best split with each on cards of their own (on one GPU: the advice says it needs two).
pub fn advise_in(ratio: f64, gpus: usize, room: Option<Room>) -> Advice {
    let crowded = room.filter(|r| !r.holds(r.together_gib));
    let fastest = advise_by_rate(ratio, gpus);
    match crowded {
        Some(_) if fastest.gpus >= 2 => {
            let g = fastest.gpus;
            let best = (1..g)
                .max_by(|&a, &b| {
                    let rate = |t: usize| (t as f64).min((g - t) as f64 / fastest.ratio);
                    rate(a).total_cmp(&rate(b))
                })
                .unwrap_or(1);
            Advice {
                split: Some((best, g - best)),
                crowded,
                ..fastest
            }
        }
        _ => Advice { crowded, ..fastest },
    }
}

fn advise_by_rate(ratio: f64, gpus: usize) -> Advice {
    let ratio = if ratio.is_finite() && ratio > 0.0 {
        ratio
    } else {
        1.0
    };
    let g = gpus.max(1);
    let shared = g as f64 / (1.0 + ratio);
    let split = (1..g)
        .map(|t| (t, (t as f64).min((g - t) as f64 / ratio)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|(_, rate)| *rate >= SPLIT_WITHIN * shared)
        .map(|(t, _)| (t, g - t));
    Advice {
        ratio,
        gpus: g,
        split,
        crowded: None,
    }
}

impl Advice {
    /// CUDA device indices of the targets and of the drafters.
    pub fn devices(&self) -> (Vec<usize>, Vec<usize>) {
        match self.split {
            Some((t, _)) => ((0..t).collect(), (t..self.gpus).collect()),
            None => ((0..self.gpus).collect(), (0..self.gpus).collect()),
        }
    }

    /// "drafter stage 3.1x the target's: 1 target + 3 drafters per 4 GPUs".
    pub fn text(&self) -> String {
        let stage = if self.ratio >= 1.0 {
            format!("drafter stage {:.1}x the target's", self.ratio)
        } else {
            format!("target stage {:.1}x the drafter's", 1.0 / self.ratio)
        };
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let how = match self.split {
            Some((t, d)) => format!(
                "{} + {} per {}",
                plural(t, "target"),
                plural(d, "drafter"),
                plural(self.gpus, "GPU")
            ),
            None if self.gpus == 1 => "target and drafter share the GPU".to_string(),
            None => format!("a target and a drafter on each of the {} GPUs", self.gpus),
        };
        match self.crowded {
            None => format!("{stage}: {how}"),
            Some(r) if self.gpus == 1 => format!(
                "{stage}: a target and a drafter need about {:.0} GiB together, more than the \
                 GPU's {:.0} GiB: give each a GPU of its own (2 GPUs){}",
                r.together_gib,
                r.card_gib,
                r.too_big_alone()
            ),
            Some(r) => format!(
                "{stage}: {how} (together about {:.0} GiB, more than a {:.0} GiB GPU holds){}",
                r.together_gib,
                r.card_gib,
                r.too_big_alone()
            ),
        }
    }

    /// The flags that place the workers so.
    pub fn flags(&self) -> String {
        let list = |v: Vec<usize>| {
            v.iter()
                .map(|i| format!("cuda:{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (t, d) = self.devices();
        format!("--target-devices {} --drafter-devices {}", list(t), list(d))
    }
}

impl Room {
    /// What to add where even a card of its own is too small for the larger of the two.
    fn too_big_alone(&self) -> String {
        if self.holds(self.apart_gib) {
            String::new()
        } else {
            format!(
                "; even alone the larger needs about {:.0} GiB: lower seq_len, batch or anchors",
                self.apart_gib
            )
        }
    }
}

/// The stages' cost ratio in a running pipeline: each role's busy milliseconds per step (its
/// queue waits left out) over the last 10 s, averaged over its workers on GPUs of their own;
/// `None` until both have finished steps, or where every target shares its device with a
/// drafter (their times then stretch each other and cannot be told apart).
pub fn measured_ratio(s: &Snapshot) -> Option<f64> {
    let devices = |role: Role| -> Vec<&str> {
        s.threads
            .iter()
            .filter(|t| t.role == role)
            .map(|t| t.device.as_str())
            .collect()
    };
    let (targets, drafters) = (devices(Role::Target), devices(Role::Drafter));
    let apart = |t: &super::snapshot::ThreadView| match t.role {
        Role::Target => !drafters.contains(&t.device.as_str()),
        _ => !targets.contains(&t.device.as_str()),
    };
    let busy = |role: Role| -> Option<f64> {
        let ms: Vec<f64> = s
            .threads
            .iter()
            .filter(|t| t.role == role && t.w10.steps > 0 && apart(t))
            .map(|t| {
                let waits: f64 = role
                    .phases()
                    .iter()
                    .filter(|p| p.is_wait())
                    .map(|p| t.w10.ms_per_step(*p))
                    .sum();
                t.w10.step_ms() - waits
            })
            .collect();
        (!ms.is_empty()).then(|| ms.iter().sum::<f64>() / ms.len() as f64)
    };
    let (t, d) = (busy(Role::Target)?, busy(Role::Drafter)?);
    (t > 0.0 && d > 0.0).then_some(d / t)
}

/// The advice for a running pipeline on `gpus` GPUs: from the measured stage times where they
/// can be told apart, else from the FLOP estimate; with which it came from. `room`: the run's
/// memory estimate against its cards, where known (a view from snapshots alone has none).
pub fn for_run(s: &Snapshot, gpus: usize, room: Option<Room>) -> Option<(Advice, &'static str)> {
    if gpus == 0 {
        return None;
    }
    match (measured_ratio(s), s.stage_ratio_flops) {
        (Some(r), _) => Some((advise_in(r, gpus, room), "measured")),
        (None, Some(r)) => Some((advise_in(r, gpus, room), "from FLOPs")),
        (None, None) => None,
    }
}

/// `for_run` on the GPUs NVML shows this process (it also lists those CUDA_VISIBLE_DEVICES
/// hides), on the host with the most of them where a view holds several hosts.
pub fn for_snapshot(s: &Snapshot) -> Option<(Advice, &'static str)> {
    match &s.gpus {
        // Per host (a merged view may hold several): the most GPUs one of them has.
        super::snapshot::GpuPanel::Present(g) => {
            let on = |host: &Option<String>| {
                g.iter()
                    .filter(|o| o.cuda.is_some() && &o.host == host)
                    .count()
            };
            for_run(s, g.iter().map(|o| on(&o.host)).max().unwrap_or(0), None)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 30: a view of two hosts with two GPUs each advises for two GPUs (one host's), not
    /// four (`--drafter-devices cuda:3` would name a device neither host has).
    #[test]
    fn a_view_of_several_hosts_advises_for_one_hosts_gpus() {
        use crate::telemetry::snapshot::{GpuPanel, GpuView};
        let gpu = |index: u32, host: Option<&str>| GpuView {
            index,
            cuda: Some(index),
            host: host.map(String::from),
            ..GpuView::default()
        };
        let s = Snapshot {
            stage_ratio_flops: Some(3.1),
            gpus: GpuPanel::Present(vec![
                gpu(0, None),
                gpu(1, None),
                gpu(0, Some("far")),
                gpu(1, Some("far")),
            ]),
            ..Snapshot::default()
        };
        let (advice, _) = for_snapshot(&s).expect("advice");
        assert_eq!(advice, for_run(&s, 2, None).unwrap().0);
        assert_ne!(advice, for_run(&s, 4, None).unwrap().0);
    }

    #[test]
    fn a_drafter_three_times_the_target_gets_three_of_four_gpus() {
        let a = advise(3.1, 4);
        assert_eq!(a.split, Some((1, 3)));
        assert_eq!(
            a.text(),
            "drafter stage 3.1x the target's: 1 target + 3 drafters per 4 GPUs"
        );
        assert_eq!(
            a.flags(),
            "--target-devices cuda:0 --drafter-devices cuda:1,cuda:2,cuda:3"
        );
    }

    /// Qwen3-32B's shapes on 80 GB cards: about 104 GiB together (src/engine/model/memory.rs),
    /// so the workers go on cards of their own even where sharing would be faster.
    #[test]
    fn a_target_and_drafter_too_big_for_one_card_get_cards_of_their_own() {
        let room = Room {
            together_gib: 104.0,
            apart_gib: 69.0,
            card_gib: 79.2,
        };
        // Drafter 2x: sharing 2 GPUs would move 2/3 of a batch a target-time, a split 1/2.
        assert_eq!(advise(2.0, 2).split, None);
        let a = advise_in(2.0, 2, Some(room));
        assert_eq!(a.split, Some((1, 1)));
        assert_eq!(
            a.text(),
            "drafter stage 2.0x the target's: 1 target + 1 drafter per 2 GPUs (together about \
             104 GiB, more than a 79 GiB GPU holds)"
        );
        let one = advise_in(2.0, 1, Some(room));
        assert_eq!(one.split, None);
        assert!(
            one.text()
                .contains("need about 104 GiB together, more than the GPU's 79 GiB")
                && one.text().contains("(2 GPUs)"),
            "{}",
            one.text()
        );
        // On an H200 (140 GiB) they share; the advice is the rate's alone.
        let big = Room {
            card_gib: 140.4,
            ..room
        };
        assert_eq!(advise_in(2.0, 2, Some(big)), advise(2.0, 2));
        // Where even one side alone is too big, the advice says what lowers it.
        let huge = Room {
            apart_gib: 90.0,
            ..room
        };
        assert!(advise_in(2.0, 2, Some(huge)).text().ends_with(
            "even alone the larger needs about 90 GiB: lower seq_len, batch or anchors"
        ));
    }

    #[test]
    fn stages_that_do_not_divide_the_gpus_share_them() {
        // 2 GPUs, drafter 2x: a 1 + 1 split moves 1/2 batch per target-time, sharing 2/3.
        let a = advise(2.0, 2);
        assert_eq!(a.split, None);
        assert_eq!(a.devices(), (vec![0, 1], vec![0, 1]));
        assert!(a
            .text()
            .ends_with("a target and a drafter on each of the 2 GPUs"));
        // Equal stages on 2 GPUs: a split is as fast as sharing, and is preferred.
        assert_eq!(advise(1.0, 2).split, Some((1, 1)));
        assert_eq!(advise(2.0, 1).split, None, "one GPU is always shared");
        assert!(advise(0.5, 3)
            .text()
            .starts_with("target stage 2.0x the drafter's"));
    }
}
