//! The per-thread part of a snapshot: each thread's step in progress, its row (windows, CPU,
//! state, step sizes), and the step spans of the records taken since the last snapshot.

use super::{Assembler, W1, W10};
use crate::telemetry::live::LiveTime;
use crate::telemetry::phase_recorder::{LiveRead, ThreadInfo};
use crate::telemetry::snapshot::{PhaseWindow, StepSpan, ThreadState, ThreadView};
use crate::telemetry::switches::{GpuTiming, Switches};

impl Assembler {
    /// Each thread's step in progress, to be counted up to now (none while paused).
    pub(super) fn live_times(
        &self,
        threads: &[ThreadInfo],
        live: &[LiveRead],
        switches: &Switches,
        paused: bool,
        stall_ns: u64,
    ) -> Vec<Option<LiveTime>> {
        threads
            .iter()
            .zip(live)
            .enumerate()
            .map(|(i, (t, l))| {
                (!paused).then(|| LiveTime {
                    live: *l,
                    expected_ns: self.recent.expected_ns(i),
                    tokens: match self.names.counts_tokens(t.role) {
                        true => self.recent.tokens(i),
                        false => 0,
                    },
                    phases: switches.profiling(),
                    waiting: self.names.is_wait(l.phase),
                    device_timed: t.on_gpu() && switches.gpu_timing() == GpuTiming::Events,
                    stall_ns,
                })
            })
            .collect()
    }

    /// One row per registered thread, in pipeline order: loader, targets, drafters; by name
    /// within a role.
    pub(super) fn thread_views(
        &self,
        threads: &[ThreadInfo],
        now_ns: u64,
        lives: &[Option<LiveTime>],
    ) -> Vec<ThreadView> {
        let mut v: Vec<ThreadView> = threads
            .iter()
            .enumerate()
            .map(|(i, t)| self.thread_view(i, t, now_ns, lives[i].as_ref()))
            .collect();
        v.sort_by(|a, b| (a.role.rank(), &a.name).cmp(&(b.role.rank(), &b.name)));
        v
    }

    pub(super) fn spans(&mut self, threads: &[ThreadInfo]) -> Vec<StepSpan> {
        std::mem::take(&mut self.pending)
            .into_iter()
            .filter_map(|r| {
                let t = threads.get(r.thread)?;
                let phases = self
                    .names
                    .phases(t.role)
                    .iter()
                    .map(|p| (*p, r.phase_ns[p.index()]))
                    .filter(|(_, ns)| *ns > 0)
                    .collect();
                Some(StepSpan {
                    thread: t.name.clone(),
                    role: t.role,
                    end_ns: r.end_ns,
                    wall_ns: r.wall_ns,
                    phases,
                })
            })
            .collect()
    }

    pub(super) fn thread_view(
        &self,
        i: usize,
        t: &ThreadInfo,
        now_ns: u64,
        live: Option<&LiveTime>,
    ) -> ThreadView {
        let cpu = self.cpu.as_ref().map(|c| &c.threads);
        let alive = cpu.map(|c| c.contains_key(&t.tid)).unwrap_or(true);
        let phase = t.live.phase();
        let state = if !alive {
            ThreadState::Exited
        } else if self.names.is_wait(phase) {
            ThreadState::Waiting
        } else {
            ThreadState::Working
        };
        let with_live = |mut w: PhaseWindow, from: u64| {
            if let Some(l) = live {
                w.add_in_flight(&l.in_window(now_ns, from));
            }
            w
        };
        ThreadView {
            name: t.name.clone(),
            role: t.role,
            device: t.device.clone(),
            tid: t.tid,
            cpu_pct: cpu.and_then(|c| c.get(&t.tid)).map(|c| c.cpu_pct),
            phase,
            phase_s: live
                .map(|l| now_ns.saturating_sub(l.live.phase_start_ns) as f64 / 1e9)
                .unwrap_or(0.0),
            state,
            os_state: cpu.and_then(|c| c.get(&t.tid)).map(|c| c.state),
            w1: with_live(self.windows.thread(i, W1), self.windows.window_start(W1)),
            w10: with_live(self.windows.thread(i, W10), self.windows.window_start(W10)),
            run: with_live(self.windows.thread_run(i), 0),
            sizes: match self.names.counts_tokens(t.role) {
                true => self.recent.sizes(i),
                false => None,
            },
        }
    }
}
