//! AdamW over fp32 master weights and gradient clipping — written out so that the optimizer
//! state can be saved beside the checkpoint and resumed (the learning-rate schedule is in
//! schedule.rs). Its rooms: the moments' precision (moments.rs), the step in fused kernels
//! (fused.rs) or in ops (plain.rs), the state file (state_file.rs).

use anyhow::Result;
pub use fused::bf16_kernel_state;
use moments::{noise_key, round_stochastic, MomentPrecision};
use plain::{PlainStep, SPAN_ELEMENTS};
use tch::{Kind, Tensor};

/// AdamW whose parameters live in one flat f32 buffer (each parameter a view into it), so that
/// clipping and the update are a handful of whole-buffer kernels instead of a few per tensor.
/// For a drafter on a GPU (`for_drafter`) the parameters are instead views of a flat bf16
/// buffer, the f32 masters rounded, which the forward reads as they are and whose gradients
/// backward writes in bf16: no cast of every weight each step, half the gradients' memory.
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    /// (offset, numel) of each parameter in the flat buffers.
    spans: Vec<(i64, i64)>,
    /// The f32 master weights.
    flat: Tensor,
    /// The bf16 weights the parameters are views into, where they are not views of `flat`.
    working: Option<Tensor>,
    /// The moments, f32 or bf16 (`moments`).
    m: Tensor,
    v: Tensor,
    moments: MomentPrecision,
    /// Elements a span of the plain step with bf16 moments (`SPAN_ELEMENTS`; tests take less).
    span_elements: i64,
    /// The gradients gathered by `clip_grad_norm`, used by `step`.
    flat_grad: Option<Tensor>,
    /// Where the parameters' `.grad` live once `keep_grads_flat` ran (a view each).
    grad_buffer: Option<Tensor>,
    /// Whether the step goes through libtorch's fused CUDA kernel (decided once, see `fused`).
    fused_step: bool,
    /// What `clip_grad_norm` left for the step to divide the gradients by (a device scalar >= 1),
    /// where the fused kernel does the division as it reads them: one pass over the gradients
    /// less.
    clip_divisor: Option<Tensor>,
    pub step: i64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    /// Over `params` (name, tensor), sorted by name so that the state file is stable, with f32
    /// moments. The parameters are moved into one buffer: every handle to them (the VarStore,
    /// the modules) sees the same storage afterwards.
    pub fn new(params: Vec<(String, Tensor)>) -> AdamW {
        AdamW::new_in(params, MomentPrecision::F32)
    }

    /// `new` with the moments made in `moments` at once (at qwen3-32b's drafter, f32 moments
    /// made first and narrowed after would hold 20 GB more while the drafter is built).
    pub fn new_in(mut params: Vec<(String, Tensor)>, moments: MomentPrecision) -> AdamW {
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let device = params
            .first()
            .map(|(_, p)| p.device())
            .unwrap_or(tch::Device::Cpu);
        let mut spans = Vec::with_capacity(params.len());
        let mut total = 0;
        for (_, p) in &params {
            spans.push((total, p.numel() as i64));
            total += p.numel() as i64;
        }
        let flat = Tensor::zeros([total], (Kind::Float, device));
        {
            let _g = tch::no_grad_guard();
            for ((_, p), (off, n)) in params.iter_mut().zip(&spans) {
                let mut view = flat.narrow(0, *off, *n).view(p.size().as_slice());
                view.copy_(p);
                p.set_data(&view);
            }
        }
        AdamW {
            params,
            spans,
            m: Tensor::zeros([total], (moments.kind(), device)),
            v: Tensor::zeros([total], (moments.kind(), device)),
            moments,
            span_elements: SPAN_ELEMENTS,
            flat,
            working: None,
            flat_grad: None,
            grad_buffer: None,
            clip_divisor: None,
            fused_step: device.is_cuda()
                && crate::cuda_shim::AVAILABLE
                && crate::engine::gpu::fast_paths::on(
                    crate::engine::gpu::fast_paths::FastPath::FusedAdamw,
                ),
            step: 0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }

    /// `new` with the moments in `moments`, and for a drafter on a GPU (unless `--disable
    /// bf16-weights`) the parameters made views of one flat bf16 buffer beside the f32 masters:
    /// the drafter computes in bf16 there, so its forward reads them with no cast, and backward
    /// leaves bf16 gradients.
    pub fn for_drafter(params: Vec<(String, Tensor)>, moments: MomentPrecision) -> AdamW {
        let opt = AdamW::new_in(params, moments);
        let on = crate::engine::gpu::fast_paths::on(
            crate::engine::gpu::fast_paths::FastPath::Bf16Weights,
        );
        if opt.flat.device().is_cuda() && on {
            opt.with_bf16_weights()
        } else {
            opt
        }
    }

    /// The moments kept in `moments` (their values rounded to nearest where they change kind).
    #[cfg(test)]
    pub fn with_moments(mut self, moments: MomentPrecision) -> AdamW {
        self.m = self.m.to_kind(moments.kind());
        self.v = self.v.to_kind(moments.kind());
        self.moments = moments;
        self
    }

    /// How the moments are kept.
    pub fn moment_precision(&self) -> MomentPrecision {
        self.moments
    }

    /// The parameters made views of one flat bf16 buffer, the masters rounded (on any device:
    /// the CPU takes the plain step; tests/parity/step.rs runs the GPU's recipe so on the CPU).
    pub fn with_bf16_weights(mut self) -> AdamW {
        let _g = tch::no_grad_guard();
        let working = self.flat.to_kind(Kind::BFloat16);
        for ((_, p), (off, n)) in self.params.iter_mut().zip(&self.spans) {
            p.set_data(&working.narrow(0, *off, *n).view(p.size().as_slice()));
        }
        self.working = Some(working);
        self
    }

    /// The kind of the parameters and their gradients: bf16 where they are a working copy of
    /// the masters, else f32.
    fn grad_kind(&self) -> Kind {
        self.working.as_ref().map_or(Kind::Float, Tensor::kind)
    }

    /// Parameter `i`'s f32 master weights (a view into `flat`).
    fn master(&self, i: usize) -> Tensor {
        let (off, n) = self.spans[i];
        self.flat
            .narrow(0, off, n)
            .view(self.params[i].1.size().as_slice())
    }

    /// The working weights rounded from the masters again, after the masters changed other than
    /// through a step.
    fn refresh_working(&mut self) {
        if let Some(w) = &mut self.working {
            let _g = tch::no_grad_guard();
            w.copy_(&self.flat);
        }
    }

    fn gather_grads(&self) -> Tensor {
        let kind = self.grad_kind();
        if let Some(buffer) = &self.grad_buffer {
            return buffer.shallow_clone();
        }
        let parts: Vec<Tensor> = self
            .params
            .iter()
            .map(|(_, p)| {
                let g = p.grad();
                if g.defined() {
                    g.to_kind(kind).reshape([-1])
                } else {
                    Tensor::zeros([p.numel() as i64], (kind, p.device()))
                }
            })
            .collect();
        Tensor::cat(&parts, 0)
    }

    /// From now on the gradients live in one flat buffer laid out like the parameters (of their
    /// kind, see `for_drafter`):
    /// `attach(param, view)` makes each parameter's `.grad` a view into it, so that backward
    /// accumulates straight into the buffer (nothing is gathered, an all-reduce reads it in
    /// place). Returns the buffer.
    pub fn keep_grads_flat(
        &mut self,
        attach: impl Fn(&Tensor, &Tensor) -> Result<()>,
    ) -> Result<Tensor> {
        let buffer = Tensor::zeros(self.flat.size(), (self.grad_kind(), self.flat.device()));
        for ((_, p), (off, n)) in self.params.iter().zip(&self.spans) {
            attach(p, &buffer.narrow(0, *off, *n).view(p.size().as_slice()))?;
        }
        self.grad_buffer = Some(buffer.shallow_clone());
        Ok(buffer)
    }

    /// Whether the gradients live in one flat buffer (`keep_grads_flat` ran).
    pub fn grads_are_flat(&self) -> bool {
        self.grad_buffer.is_some()
    }

    /// The parameters (sorted by name) and each one's (offset, numel) in the flat buffers.
    pub fn layout(&self) -> impl Iterator<Item = (&str, &Tensor, (i64, i64))> {
        self.params
            .iter()
            .zip(&self.spans)
            .map(|((name, p), span)| (name.as_str(), p, *span))
    }

    /// The flat f32 master weights.
    pub fn flat_params(&self) -> &Tensor {
        &self.flat
    }

    /// The flat bf16 weights the parameters are views into, where they are not the masters.
    pub fn working_params(&self) -> Option<&Tensor> {
        self.working.as_ref()
    }

    /// Runs `change` on the flat f32 master weights (a broadcast into them), then rounds the
    /// working weights from them again where there are any.
    pub fn change_flat_params(
        &mut self,
        change: impl FnOnce(&mut Tensor) -> Result<()>,
    ) -> Result<()> {
        change(&mut self.flat)?;
        self.refresh_working();
        Ok(())
    }

    fn zero_grads(&mut self) {
        self.clip_divisor = None;
        match &mut self.grad_buffer {
            Some(buffer) => {
                let _ = buffer.zero_();
            }
            None => {
                for (_, p) in self.params.iter_mut() {
                    p.zero_grad();
                }
            }
        }
    }

    /// The gradients gathered into one flat tensor (for averaging across replicas before the
    /// clip and the step use them).
    pub fn gathered_grads(&mut self) -> &mut Tensor {
        if self.flat_grad.is_none() {
            let _g = tch::no_grad_guard();
            self.flat_grad = Some(self.gather_grads());
        }
        self.flat_grad.as_mut().expect("set above")
    }

    /// Scales the (gathered) gradients so that their global L2 norm is at most `max_norm` (on
    /// CUDA the fused step applies the scale as it reads them); returns the norm before clipping
    /// as a device scalar (no host sync).
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Tensor {
        let _g = tch::no_grad_guard();
        let mut g = match self.flat_grad.take() {
            Some(g) => g,
            None => self.gather_grads(),
        };
        // In f32 whatever the gradients' kind (read as they are on a GPU).
        let total = g.norm_scalaropt_dtype(2.0, Kind::Float);
        let divisor = ((&total + 1e-6) / max_norm).clamp_min(1.0);
        if self.fused_step {
            self.clip_divisor = Some(divisor);
        } else {
            g = g.to_kind(Kind::Float);
            let _ = g.g_div_(&divisor);
        }
        self.flat_grad = Some(g);
        total
    }

    /// One AdamW step at learning rate `lr` (on the clipped gradients when `clip_grad_norm` ran
    /// since the last step), then clears the gradients.
    pub fn step(&mut self, lr: f64) {
        self.update(lr, None);
    }

    /// `step`, applied only when the device scalar `ok` (bool) is true, with no host sync: a
    /// gated-off step leaves the weights and the moments as they were (non-finite gradients are
    /// masked out before they touch the moments). The step count goes up either way; the caller
    /// reads `ok` later with its metrics and calls `unstep` when it was false.
    pub fn step_if(&mut self, lr: f64, ok: &Tensor) {
        self.update(lr, Some(ok));
    }

    /// Takes back the step count of a step that `step_if` gated off.
    pub fn unstep(&mut self) {
        self.step -= 1;
    }

    fn update(&mut self, lr: f64, ok: Option<&Tensor>) {
        let _g = tch::no_grad_guard();
        let g = match self.flat_grad.take() {
            Some(g) => g,
            None => self.gather_grads(),
        };
        self.step += 1;
        let t = self.step as f64;
        let divisor = self.clip_divisor.take();
        if self.fused(&g, lr, t, ok, divisor.as_ref()) {
            self.zero_grads();
            return;
        }
        let mut g = g.to_kind(Kind::Float);
        if let Some(d) = &divisor {
            let _ = g.g_div_(d);
        }
        // 1.0 or 0.0 on the device: scales every change of this step.
        let gate = ok.map(|ok| {
            let _ = g.masked_fill_(&ok.logical_not(), 0.0);
            ok.to_kind(Kind::Float)
        });
        let at = PlainStep {
            lr,
            bc1: 1.0 - self.beta1.powf(t),
            bc2: 1.0 - self.beta2.powf(t),
            gate: gate.as_ref(),
        };
        match self.moments {
            MomentPrecision::F32 => {
                let (mut m, mut v) = (self.m.shallow_clone(), self.v.shallow_clone());
                self.plain_span(&mut self.flat.shallow_clone(), &g, (&mut m, &mut v), &at);
            }
            // Widened, stepped and rounded back a span at a time: the rounding's integer
            // temporaries over the whole buffer would take tens of bytes a parameter.
            MomentPrecision::Bf16 => {
                let total = self.flat.numel() as i64;
                for off in (0..total).step_by(self.span_elements as usize) {
                    let n = self.span_elements.min(total - off);
                    let part = |t: &Tensor| t.narrow(0, off, n);
                    let (mut m, mut v) = (
                        part(&self.m).to_kind(Kind::Float),
                        part(&self.v).to_kind(Kind::Float),
                    );
                    let mut flat = part(&self.flat);
                    self.plain_span(&mut flat, &part(&g), (&mut m, &mut v), &at);
                    // A gated-off step's moments are bf16 values already: they round to
                    // themselves.
                    part(&self.m).copy_(&round_stochastic(&m, noise_key(self.step, 0), off));
                    part(&self.v).copy_(&round_stochastic(&v, noise_key(self.step, 1), off));
                }
            }
        }
        self.refresh_working();
        self.zero_grads();
    }
}

mod fused;
pub mod moments;
mod plain;
mod state_file;

#[cfg(test)]
use fused::widened_adamw;
#[cfg(test)]
mod tests;
