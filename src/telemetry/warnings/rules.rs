//! The rules: each finds the conditions that hold in a snapshot (`Candidate`s); `Warnings::check`
//! holds them for their time and turns them into warnings.

use super::{Candidate, Rule, Warnings};
use crate::telemetry::snapshot::{QueueView, Snapshot, ThreadView};
use crate::telemetry::Phase;

impl Warnings {
    pub(super) fn candidates(&mut self, s: &Snapshot) -> Vec<Candidate> {
        let mut out = Vec::new();
        if s.paused {
            // Time neither works nor waits while paused: nothing to judge but drops.
            self.dropped(s, &mut out);
            return out;
        }
        self.starved(s, &mut out);
        self.blocked(s, &mut out);
        stalled(s, &mut out);
        self.gpu_idle(s, &mut out);
        self.queue_jitter(s, &mut out);
        self.profiling_cost(s, &mut out);
        self.dropped(s, &mut out);
        self.host_sync(s, &mut out);
        self.alloc_churn(s, &mut out);
        self.shapes_vary(s, &mut out);
        out
    }

    fn host_sync(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        for t in &s.threads {
            // One warning a thread: the counted syncs first, where the producer counts them.
            if let Some(c) = self.counted_host_syncs(s, t) {
                out.push(c);
                continue;
            }
            let w = &t.w10;
            // Only phases the producer counts: no count, no data, no warning.
            for p in s
                .names
                .phases(t.role)
                .iter()
                .filter(|p| w.phase_n[p.index()] > 0.0)
            {
                let share = w.share(*p);
                let sync = s.names.phase(*p) == "sync" || (self.is_sync)(*p);
                if !sync || share <= self.config.host_sync_share {
                    continue;
                }
                let sites = s.sites_of(t);
                let (top, fix) = match sites.first().filter(|x| x.at != "other") {
                    Some(x) => (
                        format!("; the costliest site: {}", x.per_step()),
                        format!(
                            "{} waits for the GPU at {}: keep that number on the device and \
                             read the step's numbers in one batched transfer at its end",
                            x.op, x.at
                        ),
                    ),
                    None => (
                        String::new(),
                        "each .item() / .cpu() / .tolist() waits for the GPU: read the step's \
                         numbers in one batched transfer, keep the rest on the device"
                            .into(),
                    ),
                };
                out.push(Candidate {
                    rule: Rule::HostSync,
                    subject: t.name.clone(),
                    evidence: format!(
                        "{} spends {:.0}% of its time in host syncs, {:.1} a step ({:.1} ms a \
                         step){top}",
                        t.name,
                        share * 100.0,
                        w.count_per_step(*p),
                        w.ms_per_step(*p)
                    ),
                    fix,
                });
            }
        }
    }

    /// A thread on a GPU that reads the device back more times a step (10 s window) than
    /// `host_syncs_per_step`, naming the phases the reads are in, most first.
    fn counted_host_syncs(&self, s: &Snapshot, t: &ThreadView) -> Option<Candidate> {
        let w = &t.w10;
        let per_step = w.host_syncs_per_step_all();
        if !t.device.starts_with("cuda") || per_step <= self.config.host_syncs_per_step {
            return None;
        }
        let mut phases: Vec<(Phase, f64)> = s
            .names
            .phases(t.role)
            .iter()
            .map(|p| (*p, w.host_syncs_per_step(*p)))
            .filter(|(_, n)| *n > 0.0)
            .collect();
        phases.sort_by(|a, b| b.1.total_cmp(&a.1));
        let (top, _) = *phases.first()?;
        let by_phase: Vec<String> = phases
            .iter()
            .map(|(p, n)| format!("{n:.1} in {}", s.names.phase(*p)))
            .collect();
        Some(Candidate {
            rule: Rule::HostSync,
            subject: t.name.clone(),
            evidence: format!(
                "{} on {} reads the device back {per_step:.1} times a step ({}), over the budget \
                 of {}; each read waits for the work queued before it",
                t.name,
                t.device,
                by_phase.join(", "),
                self.config.host_syncs_per_step
            ),
            fix: format!(
                "keep {}'s numbers on the device and read the step's figures back in one \
                 transfer at its end (cat them, one .to(cpu))",
                s.names.phase(top)
            ),
        })
    }

    fn starved(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        for q in &s.queues {
            if q.consumer_wait_share <= self.config.starved_share || s.stall.is_some() {
                continue;
            }
            out.push(Candidate {
                rule: Rule::Starved,
                subject: q.consumers.clone(),
                evidence: format!(
                    "{} wait on empty queue `{}` {:.0}% of the time (depth {}/{}); {}",
                    plural(&q.consumers),
                    q.name,
                    q.consumer_wait_share * 100.0,
                    q.depth,
                    q.capacity,
                    side(s, &q.producers),
                ),
                fix: format!(
                    "the {} side is the bottleneck: give it more workers or devices, or look at \
                     its phases (view 3)",
                    q.producers
                ),
            });
        }
    }

    fn blocked(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        // Upstream queues full is prefetching doing its job: only the last queue counts (as for
        // the verdict).
        let Some(q) = last_queue(s) else {
            return;
        };
        if q.producer_wait_share <= self.config.blocked_share || s.stall.is_some() {
            return;
        }
        out.push(Candidate {
            rule: Rule::Blocked,
            subject: q.producers.clone(),
            evidence: format!(
                "{} wait on full queue `{}` {:.0}% of the time (depth {}/{}); {}",
                plural(&q.producers),
                q.name,
                q.producer_wait_share * 100.0,
                q.depth,
                q.capacity,
                side(s, &q.consumers),
            ),
            fix: format!(
                "the {} side is the bottleneck and the {} side has time to spare: move a device \
                 from {} to {}",
                q.consumers, q.producers, q.producers, q.consumers
            ),
        });
    }

    fn profiling_cost(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        if !s.profiling {
            return;
        }
        let c = &s.self_cost;
        let workers = s.threads.len().max(1) as f64;
        // Mark time as a share of each worker's time; snapshot time as a share of the hub's
        // (one snapshot a tick of 100 ms).
        // (`abs`: a window with no step yet reads -0, which would print as "-0".)
        let marks_pct = (c.marks_per_s * c.ns_per_mark / 1e9 / workers * 100.0).abs();
        let hub_pct = (c.snapshot_us / 1e5 * 100.0).abs();
        let budget = self.config.profiling_budget_pct;
        if marks_pct <= budget && hub_pct <= budget {
            return;
        }
        out.push(Candidate {
            rule: Rule::ProfilingCost,
            subject: if marks_pct > budget { "marks" } else { "hub" }.into(),
            evidence: format!(
                "phase marks take {marks_pct:.1}% of each worker's time ({:.0} ns x {:.0}/s), \
                 snapshots {hub_pct:.1}% of the hub's ({:.0} us each); budget {budget}%",
                c.ns_per_mark,
                c.marks_per_s.abs(),
                c.snapshot_us
            ),
            fix: "press p (or --profiling off) to stop marking; step counts and tok/s stay".into(),
        });
    }

    fn dropped(&mut self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let now = s.elapsed_s;
        let counts = (s.self_cost.dropped, s.self_cost.spans_dropped);
        let before = self.drops.replace(counts).unwrap_or((0, 0));
        for (i, (n, was)) in [(counts.0, before.0), (counts.1, before.1)]
            .into_iter()
            .enumerate()
        {
            if n > was {
                let base = self.last_drop[i]
                    .filter(|(t, _)| now - t <= self.config.dropped_window_s)
                    .map(|(_, b)| b)
                    .unwrap_or(was);
                self.last_drop[i] = Some((now, base));
            }
            let Some((t, base)) = self.last_drop[i] else {
                continue;
            };
            if now - t > self.config.dropped_window_s {
                self.last_drop[i] = None;
                continue;
            }
            let (subject, what, fix) = match i {
                0 => (
                    "records",
                    "step records",
                    "the hub falls behind its workers: fewer workers, or profiling off (p)",
                ),
                _ => (
                    "spans",
                    "trace spans",
                    "more steps end per snapshot than traces keep: the timeline and exports have \
                     gaps",
                ),
            };
            out.push(Candidate {
                rule: Rule::Dropped,
                subject: subject.into(),
                evidence: format!(
                    "{} {what} dropped in the last {:.0} s ({n} in all)",
                    n - base,
                    self.config.dropped_window_s
                ),
                fix: fix.into(),
            });
        }
    }
}

fn stalled(s: &Snapshot, out: &mut Vec<Candidate>) {
    let Some(what) = &s.stall else { return };
    let thread = what.split_whitespace().next().unwrap_or("pipeline");
    out.push(Candidate {
        rule: Rule::Stalled,
        subject: thread.to_string(),
        evidence: format!("no step has ended: {what}"),
        fix: format!(
            "see where {thread} hangs (py-spy dump / gdb on the thread); a hung device, a \
             deadlock or a slow data source"
        ),
    });
}

/// The queue the verdict judges blocking on: the one whose producers rank last.
fn last_queue(s: &Snapshot) -> Option<&QueueView> {
    s.queues.iter().max_by_key(|q| {
        s.names
            .role_named(&q.producers)
            .map(|r| r.rank())
            .unwrap_or(0)
    })
}

fn plural(role: &str) -> String {
    format!("{role}s")
}

/// What the threads of a role are doing now: "target-0 in forward 1.2 s".
fn side(s: &Snapshot, role: &str) -> String {
    let threads: Vec<&ThreadView> = s
        .threads
        .iter()
        .filter(|t| s.names.role(t.role) == role)
        .collect();
    if threads.is_empty() {
        return format!("no {role} thread seen");
    }
    threads
        .iter()
        .map(|t| {
            format!(
                "{} in {} {:.1} s",
                t.name,
                s.names.phase(t.phase),
                t.phase_s
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
