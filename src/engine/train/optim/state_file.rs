//! The optimizer's state file beside a checkpoint: the f32 master weights, both moments (f32, or
//! bf16 with `--optimizer-states bf16`) and the step, as safetensors; a resumed run continues
//! from it exactly (moments of the other kind load widened or rounded to nearest).

use super::AdamW;
use crate::engine::model::tensor_file::{write_one_at_a_time, Pending, TensorFile};
use anyhow::{Context, Result};
use std::path::Path;
use tch::{Kind, Tensor};

impl AdamW {
    /// Saves the fp32 master weights, m, v and the step (safetensors + the step in `step`), a
    /// tensor brought to the host and written at a time.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut pending: Vec<Pending> = Vec::new();
        for (i, ((name, p), (off, n))) in self.params.iter().zip(&self.spans).enumerate() {
            let shape = p.size();
            pending.push(Pending {
                name: format!("master.{name}"),
                kind: Kind::Float,
                shape: shape.clone(),
                make: Box::new(move || self.master(i)),
            });
            for (prefix, buf) in [("exp_avg", &self.m), ("exp_avg_sq", &self.v)] {
                let shape = shape.clone();
                pending.push(Pending {
                    name: format!("{prefix}.{name}"),
                    kind: buf.kind(),
                    shape: shape.clone(),
                    make: Box::new(move || buf.narrow(0, *off, *n).view(shape.as_slice())),
                });
            }
        }
        let step = self.step;
        pending.push(Pending {
            name: "step".into(),
            kind: Kind::Int64,
            shape: vec![1],
            make: Box::new(move || Tensor::from_slice(&[step])),
        });
        write_one_at_a_time(path, &pending)
            .with_context(|| format!("cannot write optimizer state {}", path.display()))
    }

    /// Loads what `save` wrote, a tensor read from disk at a time (no whole copy of the state in
    /// host memory).
    pub fn load(&mut self, path: &Path) -> Result<()> {
        const FIX: &str = "the checkpoint is damaged: resume from an earlier checkpoint, or \
                           start from its weights alone with --drafter";
        let file = TensorFile::open(path).map_err(|why| {
            anyhow::anyhow!(
                "{}: not a readable optimizer state ({why}); {FIX}",
                path.display()
            )
        })?;
        let read = |key: &str, want: &[i64]| -> Result<Tensor> {
            let shape = file.shape(key).unwrap_or_default();
            if shape != want {
                anyhow::bail!(
                    "{}: `{key}` has shape {shape:?}, expected {want:?}",
                    path.display()
                );
            }
            // The reader's error names the file and the tensor already.
            file.read(key).map_err(|e| anyhow::anyhow!("{e:#}; {FIX}"))
        };
        let _g = tch::no_grad_guard();
        for (i, ((name, p), (off, n))) in self.params.iter().zip(&self.spans).enumerate() {
            // The master weights (absent in checkpoints of earlier versions, whose weights file
            // held them in fp32).
            let key = format!("master.{name}");
            if file.contains(&key) {
                self.master(i).copy_(&read(&key, &p.size())?);
            }
            for (prefix, buf) in [("exp_avg", &self.m), ("exp_avg_sq", &self.v)] {
                let mut dst = buf.narrow(0, *off, *n).view(p.size().as_slice());
                let key = format!("{prefix}.{name}");
                if !file.contains(&key) {
                    anyhow::bail!(
                        "{} lacks `{key}`: it does not belong to this drafter",
                        path.display()
                    );
                }
                dst.copy_(&read(&key, &dst.size())?);
            }
        }
        // One count, shape [1] as written (or a scalar).
        let one = file
            .shape("step")
            .filter(|s| s.iter().product::<i64>() == 1);
        if one.is_none() {
            anyhow::bail!("{} lacks `step` (a single count): {FIX}", path.display());
        }
        let step = file
            .read("step")
            .map_err(|e| anyhow::anyhow!("{e:#}; {FIX}"))?;
        self.step = step
            .f_to_kind(Kind::Int64)
            .ok()
            .and_then(|t| Vec::<i64>::try_from(t.reshape([1])).ok())
            .and_then(|v| v.first().copied())
            .with_context(|| format!("{}: `step` is not a count", path.display()))?;
        self.refresh_working();
        Ok(())
    }
}
