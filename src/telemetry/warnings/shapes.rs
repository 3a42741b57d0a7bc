//! `shapes_vary`: a stage's batches change shape from step to step. Read from the tokens the
//! last steps of the stage that counts the pipeline's tokens carried (our drafters: a batch's
//! rows times its length; a watched PyTorch pipeline's `input_ids` elements, or what its
//! `end_step(tokens=)` says): sizes that differ are shapes that differ. On a GPU each new shape
//! takes new blocks from the caching allocator and runs outside CUDA graphs (our drafter's graphs
//! replay one shape); a `torch.compile`d model recompiles for it.

use super::{Candidate, Rule, Warnings};
use crate::telemetry::snapshot::{Snapshot, StepSizes, ThreadState};

impl Warnings {
    /// One warning for each stage with threads whose last steps (up to `stall::SIZE_STEPS`) had at
    /// least `shapes_distinct` sizes, about the stage (a stable subject while its replicas come and
    /// go above the threshold), naming the first such thread and counting the others.
    pub(super) fn shapes_vary(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let mut varying: Vec<(&str, &str, StepSizes, bool)> = Vec::new();
        for t in &s.threads {
            let Some(z) = t.sizes else { continue };
            // Judged before the thread has `SIZE_STEPS` steps: fewer steps can only show fewer
            // sizes, so a young run whose every step differs warns after `shapes_distinct`.
            if t.state == ThreadState::Exited || z.distinct < self.config.shapes_distinct {
                continue;
            }
            let gpu = t.device.starts_with("cuda");
            varying.push((s.names.role(t.role), t.name.as_str(), z, gpu));
        }
        let mut stages: Vec<&str> = varying.iter().map(|v| v.0).collect();
        stages.dedup();
        for stage in stages {
            let mut of_stage = varying.iter().filter(|v| v.0 == stage);
            let Some(&(_, name, z, gpu)) = of_stage.next() else {
                continue;
            };
            let others = match of_stage.count() {
                0 => String::new(),
                1 => "; 1 other thread of the stage too".into(),
                n => format!("; {n} other threads of the stage too"),
            };
            let cost = match gpu {
                true => {
                    "each new shape takes new blocks from the caching allocator and runs \
                         outside CUDA graphs"
                }
                false => {
                    "on a GPU each new shape would take new blocks from the caching \
                          allocator and run outside CUDA graphs"
                }
            };
            out.push(Candidate {
                rule: Rule::ShapesVary,
                subject: stage.to_string(),
                evidence: format!(
                    "{name}: {} different sizes (tokens a step) in its last {} steps, {} to {} \
                     tokens{others}",
                    z.distinct, z.steps, z.min, z.max
                ),
                fix: format!(
                    "pack rows to one length, or pad to a few fixed lengths (buckets): {cost}; \
                     torch.compile recompiles for it"
                ),
            });
        }
    }
}
