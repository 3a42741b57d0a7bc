//! What a run comes to, computed in one place: the headless `summary:` line, the TUI's summary
//! panel once the run ends, and the line the TUI prints on exit.

use crate::telemetry::Snapshot;
use std::path::{Path, PathBuf};

/// Where the run's files go, known before it starts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunInfo {
    /// The step the run resumed from (0 for a fresh run).
    pub start_step: u64,
    /// `--save-dir`: the last checkpoint is its newest `step-*` directory.
    pub save_dir: Option<PathBuf>,
    /// `--record`.
    pub recording: Option<PathBuf>,
    /// `--steps`: where the run stops (the header shows `step 163/300` and an ETA).
    pub steps: Option<u64>,
}

/// The numbers of a run's last snapshot and where its files are.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub step: u64,
    pub from_step: u64,
    pub tokens: u64,
    pub elapsed_s: f64,
    pub loss: Option<f32>,
    pub tau: Option<f32>,
    pub verdict: String,
    pub dropped: u64,
    /// The newest `step-*` directory in the save dir, when there is one.
    pub checkpoint: Option<PathBuf>,
    pub recording: Option<PathBuf>,
}

impl Summary {
    /// From the run's last snapshot; the checkpoint is looked up in the save dir now.
    pub fn of(s: &Snapshot, info: &RunInfo) -> Summary {
        Summary {
            step: s.train.step,
            from_step: info.start_step,
            tokens: s.train.tokens_total,
            elapsed_s: s.elapsed_s,
            loss: s.train.loss,
            tau: s.train.tau,
            verdict: s.names.verdict_short(s.verdict).to_string(),
            dropped: s.self_cost.dropped,
            checkpoint: info.save_dir.as_deref().and_then(last_checkpoint),
            recording: info.recording.clone(),
        }
    }

    /// Steps this run made (not counting those it resumed from).
    pub fn steps(&self) -> u64 {
        self.step.saturating_sub(self.from_step)
    }

    /// Tokens a second over the whole run.
    pub fn mean_tok_s(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.tokens as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    /// `summary: step=… from_step=… …`, one `key=value` per field (paths last, when set).
    pub fn line(&self) -> String {
        let f = |v: Option<f32>| v.map(|x| format!("{x:.4}")).unwrap_or_else(|| "-".into());
        let mut out = format!(
            "summary: step={} from_step={} steps={} loss={} tau={} mean_tok/s={:.0} elapsed={:.1}s verdict={} dropped={} tokens={}",
            self.step,
            self.from_step,
            self.steps(),
            f(self.loss),
            f(self.tau),
            self.mean_tok_s(),
            self.elapsed_s,
            self.verdict,
            self.dropped,
            self.tokens,
        );
        if let Some(p) = &self.checkpoint {
            out.push_str(&format!(" checkpoint={}", p.display()));
        }
        if let Some(p) = &self.recording {
            out.push_str(&format!(" recording={}", p.display()));
        }
        out
    }
}

fn last_checkpoint(dir: &Path) -> Option<PathBuf> {
    crate::save_layout::checkpoints_in(dir).ok()?.pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_counts_steps_from_the_resume_point_and_names_the_files() {
        let mut s = Snapshot::default();
        s.train.step = 300;
        s.train.tokens_total = 60_000;
        s.elapsed_s = 30.0;
        s.train.loss = Some(2.5);
        let info = RunInfo {
            start_step: 100,
            save_dir: None,
            recording: Some("run.rec".into()),
            steps: None,
        };
        let line = Summary::of(&s, &info).line();
        assert!(line.starts_with("summary: step=300 from_step=100 steps=200 loss=2.5000 tau=- mean_tok/s=2000 elapsed=30.0s"), "{line}");
        assert!(line.contains(" tokens=60000"), "{line}");
        assert!(line.ends_with(" recording=run.rec"), "{line}");
        assert!(!line.contains("checkpoint="), "{line}");
    }
}
