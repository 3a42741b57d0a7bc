//! AdamW over fp32 master weights, the cosine schedule with warm-up, and gradient clipping —
//! written out so that the optimizer state can be saved beside the checkpoint and resumed.

use anyhow::{Context, Result};
use std::collections::HashMap;
use std::path::Path;
use tch::{Kind, Tensor};

pub struct AdamW {
    params: Vec<(String, Tensor)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    pub step: i64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    /// Over `params` (name, tensor), sorted by name so that the state file is stable.
    pub fn new(mut params: Vec<(String, Tensor)>) -> AdamW {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let m = params.iter().map(|(_, p)| p.zeros_like()).collect();
        let v = params.iter().map(|(_, p)| p.zeros_like()).collect();
        AdamW {
            params,
            m,
            v,
            step: 0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    /// Scales gradients so that their global L2 norm is at most `max_norm`; returns the norm
    /// before clipping as a device scalar (no host sync).
    pub fn clip_grad_norm(&self, max_norm: f64) -> Tensor {
        let _g = tch::no_grad_guard();
        let norms: Vec<Tensor> = self
            .params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .map(|g| g.to_kind(Kind::Float).norm())
            .collect();
        if norms.is_empty() {
            return Tensor::zeros([], (Kind::Float, self.device()));
        }
        let total = Tensor::stack(&norms, 0).norm();
        let scale = (Tensor::full([], max_norm, (Kind::Float, total.device())) / (&total + 1e-6))
            .clamp_max(1.0);
        for (_, p) in &self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.g_mul_(&scale);
            }
        }
        total
    }

    pub fn device(&self) -> tch::Device {
        self.params
            .first()
            .map(|(_, p)| p.device())
            .unwrap_or(tch::Device::Cpu)
    }

    /// One AdamW step at learning rate `lr`, then clears the gradients.
    pub fn step(&mut self, lr: f64) {
        let _g = tch::no_grad_guard();
        self.step += 1;
        let t = self.step as f64;
        let bc1 = 1.0 - self.beta1.powf(t);
        let bc2 = 1.0 - self.beta2.powf(t);
        for (i, (_, p)) in self.params.iter_mut().enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let m = &mut self.m[i];
            let v = &mut self.v[i];
            let _ = m
                .g_mul_scalar_(self.beta1)
                .g_add_(&(&g * (1.0 - self.beta1)));
            let _ = v
                .g_mul_scalar_(self.beta2)
                .addcmul_(&g, &(&g * (1.0 - self.beta2)));
            if self.weight_decay > 0.0 {
                let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
            }
            let denom = (&*v / bc2).sqrt() + self.eps;
            let update = &*m / denom * (lr / bc1);
            let _ = p.g_sub_(&update);
            p.zero_grad();
        }
    }

    /// Saves m, v and the step (safetensors + the step in `step`).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut named: Vec<(String, Tensor)> = Vec::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            named.push((
                format!("exp_avg.{name}"),
                self.m[i].to_device(tch::Device::Cpu),
            ));
            named.push((
                format!("exp_avg_sq.{name}"),
                self.v[i].to_device(tch::Device::Cpu),
            ));
        }
        named.push(("step".into(), Tensor::from_slice(&[self.step])));
        Tensor::write_safetensors(&named, path)
            .with_context(|| format!("cannot write optimizer state {}", path.display()))
    }

    pub fn load(&mut self, path: &Path) -> Result<()> {
        let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(path)
            .map_err(|e| {
                anyhow::anyhow!("{}: not a readable optimizer state ({e})", path.display())
            })?
            .into_iter()
            .collect();
        let _g = tch::no_grad_guard();
        for (i, (name, _)) in self.params.iter().enumerate() {
            for (prefix, dst) in [("exp_avg", &mut self.m[i]), ("exp_avg_sq", &mut self.v[i])] {
                let key = format!("{prefix}.{name}");
                let t = tensors.get(&key).with_context(|| {
                    format!(
                        "{} lacks `{key}`: it does not belong to this drafter",
                        path.display()
                    )
                })?;
                if t.size() != dst.size() {
                    anyhow::bail!(
                        "{}: `{key}` has shape {:?}, expected {:?}",
                        path.display(),
                        t.size(),
                        dst.size()
                    );
                }
                dst.copy_(t);
            }
        }
        self.step = tensors
            .get("step")
            .and_then(|t| Vec::<i64>::try_from(t).ok())
            .and_then(|v| v.first().copied())
            .with_context(|| format!("{} lacks `step`", path.display()))?;
        Ok(())
    }
}

/// Cosine schedule with linear warm-up over `warmup` of `total` steps, to zero.
pub fn cosine_lr(peak: f64, step: u64, total: u64, warmup_share: f64) -> f64 {
    let total = total.max(1) as f64;
    let warm = (total * warmup_share).max(1.0);
    let s = step as f64;
    if s < warm {
        return peak * (s + 1.0) / warm;
    }
    let progress = ((s - warm) / (total - warm).max(1.0)).min(1.0);
    0.5 * peak * (1.0 + (std::f64::consts::PI * progress).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_zero() {
        assert!(cosine_lr(1.0, 0, 100, 0.04) < 0.3);
        assert!((cosine_lr(1.0, 3, 100, 0.04) - 1.0).abs() < 1e-9);
        assert!((cosine_lr(1.0, 4, 100, 0.04) - 1.0).abs() < 1e-9);
        assert!(cosine_lr(1.0, 50, 100, 0.04) < 0.6);
        assert!(cosine_lr(1.0, 100, 100, 0.04) < 1e-9);
    }

    #[test]
    fn adamw_minimises_a_quadratic_and_clips() {
        let x = Tensor::from_slice(&[3.0f32, -2.0]).set_requires_grad(true);
        let mut opt = AdamW::new(vec![("x".into(), x.shallow_clone())]);
        for _ in 0..300 {
            (&x * &x).sum(Kind::Float).backward();
            let norm = opt.clip_grad_norm(1.0);
            assert!(f32::try_from(&norm).unwrap() >= 0.0);
            opt.step(0.05);
        }
        let v = Vec::<f32>::try_from(&x).unwrap();
        assert!(v.iter().all(|t| t.abs() < 0.1), "{v:?}");
        assert_eq!(opt.step, 300);
    }
}
