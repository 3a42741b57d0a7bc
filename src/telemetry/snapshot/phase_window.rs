//! `PhaseWindow`: one thread's phase time, steps, tokens and counts over a window, and the
//! rates and shares the views and rules read from it.

use crate::telemetry::phase::{Phase, N_PHASES};
use crate::telemetry::phase_recorder::CudaCalls;
use serde::{Deserialize, Serialize};

/// Phase time of one thread over a window. Steps are counted where they end; time and tokens
/// where they happened (a step that straddles the window's start counts in part).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseWindow {
    /// Steps that ended in the window.
    pub steps: u64,
    /// Time covered by phase records (profiled steps of the current timing mode, live time).
    pub wall_ns: u64,
    pub phase_ns: [u64; N_PHASES],
    /// Steps' worth of phase records in the window (fractional at its edges).
    #[serde(default)]
    pub phase_steps: f64,
    pub tokens: f64,
    /// Wall-clock length of the window (not of the steps in it).
    pub span_ns: u64,
    /// Of `wall_ns`, the time of steps still running (counted up to now).
    #[serde(default)]
    pub live_ns: u64,
    /// Of `wall_ns` (device-timed), the time the GPU sat idle waiting for the host.
    #[serde(default)]
    pub gpu_idle_ns: u64,
    /// Times each phase was entered, where the producer counts them (a Python pipeline's host
    /// syncs); fractional at the window's edges like `phase_steps`.
    #[serde(default)]
    pub phase_n: [f64; N_PHASES],
    /// Host syncs (reads of the device back to the host) of the steps that ended in the window,
    /// by phase, where the producer counts them (our engine); counted where `steps` is, with or
    /// without profiling.
    #[serde(default)]
    pub host_syncs: [u64; N_PHASES],
    /// Of `steps`, those whose CUDA calls CUPTI counted, and those calls summed (counted where
    /// `steps` is, with or without profiling).
    #[serde(default)]
    pub cuda_steps: u64,
    #[serde(default)]
    pub cuda_calls: CudaCalls,
    /// The phases the thread entered in the window's records, a bit per phase index (kept when
    /// the phase times are cleared): a thread's line lists these, not every phase of its stage.
    #[serde(default)]
    pub entered: u64,
}

impl PhaseWindow {
    pub fn add(&mut self, other: &PhaseWindow) {
        self.entered |= other.entered;
        self.steps += other.steps;
        self.wall_ns += other.wall_ns;
        self.tokens += other.tokens;
        self.span_ns += other.span_ns;
        self.phase_steps += other.phase_steps;
        self.live_ns += other.live_ns;
        self.gpu_idle_ns += other.gpu_idle_ns;
        self.cuda_steps += other.cuda_steps;
        self.cuda_calls.add(&other.cuda_calls);
        for i in 0..N_PHASES {
            self.phase_ns[i] += other.phase_ns[i];
            self.phase_n[i] += other.phase_n[i];
            self.host_syncs[i] += other.host_syncs[i];
        }
    }

    /// Adds the time of a step still in progress (live time).
    pub fn add_in_flight(&mut self, f: &crate::telemetry::window::InFlight) {
        self.note_entered(&f.phase_ns, &[0; N_PHASES]);
        let live: u64 = f.phase_ns.iter().sum();
        for (acc, ns) in self.phase_ns.iter_mut().zip(f.phase_ns) {
            *acc += ns;
        }
        self.wall_ns += live;
        self.live_ns += live;
        self.phase_steps += f.step_share;
    }

    /// Marks the phases a record spent time in or entered as entered.
    pub fn note_entered(&mut self, phase_ns: &[u64; N_PHASES], phase_n: &[u32; N_PHASES]) {
        for (i, (ns, n)) in phase_ns.iter().zip(phase_n).enumerate() {
            if *ns > 0 || *n > 0 {
                self.entered |= 1 << i;
            }
        }
    }

    /// Of `phases`, those the thread entered, and `other` (the rest of its time); all of them
    /// when it has entered none yet (or the window comes from a recording that does not say).
    pub fn entered_of(&self, phases: &[Phase]) -> Vec<Phase> {
        phases
            .iter()
            .copied()
            .filter(|p| {
                self.entered == 0 || *p == Phase::Other || self.entered >> p.index() & 1 == 1
            })
            .collect()
    }

    /// Drops the phase times, keeping steps and tokens.
    pub fn clear_phases(&mut self) {
        self.wall_ns = 0;
        self.live_ns = 0;
        self.gpu_idle_ns = 0;
        self.phase_steps = 0.0;
        self.phase_ns = [0; N_PHASES];
        self.phase_n = [0.0; N_PHASES];
    }

    /// Steps to divide phase time by: the steps' worth of the time in the window, so a step cut
    /// by the window's edge divides by its fraction (and a step that has run for 12 s without
    /// ending reads 12,000 ms).
    fn per_step_divisor(&self) -> f64 {
        if self.wall_ns == 0 || self.phase_steps <= 0.0 {
            return 0.0;
        }
        self.phase_steps
    }

    /// Mean milliseconds per step spent in `phase`.
    pub fn ms_per_step(&self, phase: Phase) -> f64 {
        let d = self.per_step_divisor();
        if d == 0.0 {
            return 0.0;
        }
        self.phase_ns[phase.index()] as f64 / 1e6 / d
    }

    /// Mean times `phase` was entered per step (0 where the producer does not count it).
    pub fn count_per_step(&self, phase: Phase) -> f64 {
        let d = self.per_step_divisor();
        if d == 0.0 {
            return 0.0;
        }
        self.phase_n[phase.index()] / d
    }

    /// Mean host syncs per ended step in `phase` (0 where the producer does not count them).
    pub fn host_syncs_per_step(&self, phase: Phase) -> f64 {
        if self.steps == 0 {
            return 0.0;
        }
        self.host_syncs[phase.index()] as f64 / self.steps as f64
    }

    /// Mean host syncs per ended step, all phases.
    pub fn host_syncs_per_step_all(&self) -> f64 {
        if self.steps == 0 {
            return 0.0;
        }
        self.host_syncs.iter().sum::<u64>() as f64 / self.steps as f64
    }

    /// Per counted step: kernel launches, ms in launch calls, ms in sync calls (None when no
    /// step of the window had its CUDA calls counted).
    pub fn cuda_calls_per_step(&self) -> Option<(f64, f64, f64)> {
        if self.cuda_steps == 0 {
            return None;
        }
        let n = self.cuda_steps as f64;
        let c = &self.cuda_calls;
        Some((
            c.launches as f64 / n,
            c.launch_ns as f64 / 1e6 / n,
            c.sync_ns as f64 / 1e6 / n,
        ))
    }

    /// Mean wall milliseconds per step.
    pub fn step_ms(&self) -> f64 {
        let d = self.per_step_divisor();
        if d == 0.0 {
            return 0.0;
        }
        self.wall_ns as f64 / 1e6 / d
    }

    /// Share of the recorded wall time spent in `phase`, 0..1.
    pub fn share(&self, phase: Phase) -> f64 {
        if self.wall_ns == 0 {
            return 0.0;
        }
        self.phase_ns[phase.index()] as f64 / self.wall_ns as f64
    }

    pub fn steps_per_s(&self) -> f64 {
        if self.span_ns == 0 {
            return 0.0;
        }
        self.steps as f64 / (self.span_ns as f64 / 1e9)
    }
}
