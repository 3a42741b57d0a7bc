//! The critical path of the pipeline: each stage (loader, targets, drafters) can take at most
//! one item per its busy time per thread; the slowest stage sets the step time, and the gap to
//! the next one says how much speeding it up would buy.

use crate::telemetry::names::Names;
use crate::telemetry::snapshot::PhaseWindow;
use crate::telemetry::{Phase, Role};

/// One stage: its threads' mean busy time per step (wall less waits on queues).
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub role: Role,
    pub threads: usize,
    /// Mean busy ms per step of one thread.
    pub busy_ms: f64,
    /// The stage's own limit on the pipeline's step time: busy time over its threads, ms.
    pub limit_ms: f64,
    /// The phase that takes most of the busy time, and its ms per step.
    pub top: Option<(Phase, f64)>,
}

/// Stages with steps in the window, slowest (the critical one) first; roles' phases and waits
/// as `names` has them.
pub fn stages<'a>(
    threads: impl Iterator<Item = (Role, &'a PhaseWindow)>,
    names: &Names,
) -> Vec<Stage> {
    let mut out: Vec<(Role, usize, f64, [f64; crate::telemetry::N_PHASES])> = Vec::new();
    for (role, w) in threads {
        if role == Role::Hub || w.step_ms() <= 0.0 {
            continue;
        }
        let i = match out.iter().position(|s| s.0 == role) {
            Some(i) => i,
            None => {
                out.push((role, 0, 0.0, [0.0; crate::telemetry::N_PHASES]));
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.1 += 1;
        for p in names.phases(role) {
            if !names.is_wait(*p) {
                let ms = w.ms_per_step(*p);
                s.2 += ms;
                s.3[p.index()] += ms;
            }
        }
    }
    let mut stages: Vec<Stage> = out
        .into_iter()
        .map(|(role, n, busy, per_phase)| {
            let busy_ms = busy / n as f64;
            let top = names
                .phases(role)
                .iter()
                .filter(|p| !names.is_wait(**p) && **p != Phase::Other)
                .map(|p| (*p, per_phase[p.index()] / n as f64))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .filter(|t| t.1 > 0.0);
            Stage {
                role,
                threads: n,
                busy_ms,
                limit_ms: busy_ms / n as f64,
                top,
            }
        })
        .collect();
    stages.sort_by(|a, b| b.limit_ms.total_cmp(&a.limit_ms));
    stages
}

/// The sentence under the phase bars: which stage sets the step time and by how much.
pub fn summary(stages: &[Stage], names: &Names) -> Option<String> {
    let crit = stages.first()?;
    let threads = if crit.threads == 1 {
        String::new()
    } else {
        format!(" over {} threads", crit.threads)
    };
    let top = crit
        .top
        .map(|(p, ms)| format!(", most of it {} {ms:.1} ms", names.phase(p)))
        .unwrap_or_default();
    let mut s = format!(
        "critical path: {} sets the step at {:.1} ms ({:.1} ms busy a step{threads}{top})",
        names.role(crit.role),
        crit.limit_ms,
        crit.busy_ms
    );
    if let Some(next) = stages.get(1) {
        let gain = crit.limit_ms - next.limit_ms;
        s.push_str(&format!(
            "; next is {} at {:.1} ms: {:.1} ms ({:.0}%) to gain before it limits",
            names.role(next.role),
            next.limit_ms,
            gain,
            gain / crit.limit_ms.max(1e-9) * 100.0
        ));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::N_PHASES;

    fn w(ms: &[(Phase, u64)]) -> PhaseWindow {
        let mut phase_ns = [0u64; N_PHASES];
        for (p, v) in ms {
            phase_ns[p.index()] = v * 1_000_000;
        }
        PhaseWindow {
            steps: 1,
            wall_ns: phase_ns.iter().sum(),
            phase_ns,
            phase_steps: 1.0,
            span_ns: 1_000_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn the_slowest_stage_per_thread_leads() {
        let target = w(&[(Phase::Forward, 75), (Phase::HsPack, 5)]);
        let drafter = w(&[(Phase::HsWait, 45), (Phase::Backward, 35)]);
        // Two drafters of 70 ms busy each limit at 35 ms; one target at 80 ms.
        let slow_drafter = w(&[(Phase::HsWait, 10), (Phase::Backward, 70)]);
        let s = stages(
            [
                (Role::Target, &target),
                (Role::Drafter, &slow_drafter),
                (Role::Drafter, &slow_drafter),
            ]
            .into_iter(),
            &Names::builtin(),
        );
        assert_eq!(s[0].role, Role::Target);
        assert_eq!(s[0].limit_ms, 80.0);
        assert_eq!(s[0].top, Some((Phase::Forward, 75.0)));
        assert_eq!(s[1].limit_ms, 35.0);
        let text = summary(&s, &Names::builtin()).unwrap();
        assert!(text.contains("target sets the step at 80.0 ms"), "{text}");
        assert!(text.contains("45.0 ms (56%) to gain"), "{text}");
        // Waits are not busy time.
        let one = stages([(Role::Drafter, &drafter)].into_iter(), &Names::builtin());
        assert_eq!(one[0].busy_ms, 35.0);
    }
}
