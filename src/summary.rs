//! What a run comes to, computed in one place: the headless `summary:` line, the TUI's summary
//! panel once the run ends, and the line the TUI prints on exit. In a job, the line names the
//! rank, and rank 0's adds the job's totals from every rank's figures (`RankFigures`, which
//! src/cmd/session.rs exchanges through the job's store).

use crate::telemetry::Snapshot;
use serde::{Deserialize, Serialize};
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
    /// What trains, for the header: the target's name and the precisions set off their
    /// defaults (`crate::engine::spec::model_label`).
    pub model: Option<String>,
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
    /// In a job: which rank this is and, on rank 0, the job's totals.
    pub job: Option<JobPart>,
}

/// A rank's place in its job, for its `summary:` line.
#[derive(Clone, Debug, PartialEq)]
pub struct JobPart {
    pub rank: u32,
    pub world: u32,
    /// Rank 0's: every rank's figures that came in time (its own first).
    pub totals: Option<JobTotals>,
}

/// One rank's final figures, as it hands them to rank 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankFigures {
    pub rank: u32,
    pub step: u64,
    pub tokens: u64,
    pub mean_tok_s: f64,
}

/// The job's totals over the ranks that reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobTotals {
    pub reported: Vec<RankFigures>,
}

impl JobTotals {
    /// ` job.ranks=2/2 job.tokens=… job.mean_tok/s=… job.slowest=r1`: tokens and tok/s summed
    /// over the ranks that reported, the slowest of them by tok/s; `job.missing=r1,r2` names the
    /// ranks whose figures did not come in time (the sums leave them out).
    pub fn fields(&self, world: u32) -> String {
        let tokens: u64 = self.reported.iter().map(|r| r.tokens).sum();
        let tok_s: f64 = self.reported.iter().map(|r| r.mean_tok_s).sum();
        let mut out = format!(
            " job.ranks={}/{world} job.tokens={tokens} job.mean_tok/s={tok_s:.0}",
            self.reported.len()
        );
        let slowest = self
            .reported
            .iter()
            .min_by(|a, b| a.mean_tok_s.total_cmp(&b.mean_tok_s));
        if let Some(r) = slowest.filter(|_| self.reported.len() > 1) {
            out.push_str(&format!(" job.slowest=r{}", r.rank));
        }
        let missing: Vec<String> = (0..world)
            .filter(|w| !self.reported.iter().any(|r| r.rank == *w))
            .map(|w| format!("r{w}"))
            .collect();
        if !missing.is_empty() {
            out.push_str(&format!(" job.missing={}", missing.join(",")));
        }
        out
    }
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
            job: None,
        }
    }

    /// This rank's figures, for rank 0's totals.
    pub fn figures(&self, rank: u32) -> RankFigures {
        RankFigures {
            rank,
            step: self.step,
            tokens: self.tokens,
            mean_tok_s: self.mean_tok_s(),
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

    /// `summary: step=… from_step=… …`, one `key=value` per field; in a job `rank=R/W` and, on
    /// rank 0, the job's totals (`JobTotals::fields`); paths last, when set.
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
        if let Some(j) = &self.job {
            out.push_str(&format!(" rank={}/{}", j.rank, j.world));
            if let Some(t) = &j.totals {
                out.push_str(&t.fields(j.world));
            }
        }
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
            ..RunInfo::default()
        };
        let line = Summary::of(&s, &info).line();
        assert!(line.starts_with("summary: step=300 from_step=100 steps=200 loss=2.5000 tau=- mean_tok/s=2000 elapsed=30.0s"), "{line}");
        assert!(line.contains(" tokens=60000"), "{line}");
        assert!(line.ends_with(" recording=run.rec"), "{line}");
        assert!(!line.contains("checkpoint="), "{line}");
    }

    #[test]
    fn a_ranks_line_names_it_and_rank_0s_adds_the_jobs_totals_or_who_is_missing() {
        let mut s = Snapshot::default();
        s.train.step = 20;
        s.train.tokens_total = 1000;
        s.elapsed_s = 10.0;
        let info = RunInfo {
            save_dir: None,
            recording: Some("r.rec".into()),
            ..RunInfo::default()
        };
        let mut sum = Summary::of(&s, &info);
        sum.job = Some(JobPart {
            rank: 1,
            world: 3,
            totals: None,
        });
        let line = sum.line();
        assert!(
            line.contains(" tokens=1000 rank=1/3 recording=r.rec"),
            "{line}"
        );
        assert!(!line.contains("job."), "{line}");
        let fig = |rank, tokens, tok_s| RankFigures {
            rank,
            step: 20,
            tokens,
            mean_tok_s: tok_s,
        };
        let all = JobTotals {
            reported: vec![fig(0, 1000, 100.0), fig(1, 1200, 90.0), fig(2, 900, 120.0)],
        };
        assert_eq!(
            all.fields(3),
            " job.ranks=3/3 job.tokens=3100 job.mean_tok/s=310 job.slowest=r1"
        );
        let some = JobTotals {
            reported: vec![fig(0, 1000, 100.0), fig(2, 900, 120.0)],
        };
        assert_eq!(
            some.fields(3),
            " job.ranks=2/3 job.tokens=1900 job.mean_tok/s=220 job.slowest=r0 job.missing=r1"
        );
        sum.job = Some(JobPart {
            rank: 0,
            world: 3,
            totals: Some(some),
        });
        let line = sum.line();
        assert!(
            line.contains(" rank=0/3 job.ranks=2/3 ")
                && line.ends_with(" job.missing=r1 recording=r.rec"),
            "{line}"
        );
    }
}
