//! `shapes_vary`: a stage's batches change shape from step to step. Read from the tokens its
//! last steps carried (a batch's rows times its length; a watched PyTorch pipeline's
//! `input_ids` elements): sizes that differ are shapes that differ. Each new shape takes new
//! blocks from the caching allocator and runs outside CUDA graphs (our drafter's graphs replay
//! one shape; a `torch.compile`d model recompiles).

use super::{Candidate, Rule, Warnings};
use crate::telemetry::snapshot::{Snapshot, StepSizes};
use crate::telemetry::stall::SIZE_STEPS;

impl Warnings {
    /// One warning for the pipeline, about the first thread (in pipeline order) whose last
    /// `SIZE_STEPS` steps had at least `shapes_distinct` sizes; the others are named in it.
    pub(super) fn shapes_vary(&self, s: &Snapshot, out: &mut Vec<Candidate>) {
        let varying: Vec<(&str, StepSizes)> = s
            .threads
            .iter()
            .filter_map(|t| Some((t.name.as_str(), t.sizes?)))
            .filter(|(_, z)| {
                z.steps as usize >= SIZE_STEPS && z.distinct >= self.config.shapes_distinct
            })
            .collect();
        let Some((name, z)) = varying.first() else {
            return;
        };
        let others = match &varying[1..] {
            [] => String::new(),
            rest => {
                let names: Vec<&str> = rest.iter().map(|(n, _)| *n).collect();
                format!("; {} too", names.join(", "))
            }
        };
        out.push(Candidate {
            rule: Rule::ShapesVary,
            subject: name.to_string(),
            evidence: format!(
                "{name}: {} batch sizes in its last {} steps ({}-{} tokens){others}",
                z.distinct, z.steps, z.min, z.max
            ),
            fix: "pack or pad batches to a few fixed lengths: each new shape takes new blocks \
                  from the caching allocator and runs outside CUDA graphs (torch.compile \
                  recompiles)"
                .into(),
        });
    }
}
