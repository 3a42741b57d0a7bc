//! A decoder layer's self-attention (`model.layers.{i}.self_attn`): q/k/v/o projections (with
//! biases where the config has them), q_norm and k_norm per head (Qwen3 only), RoPE, and which
//! way it runs: one fused q/k/v GEMM where keys come from the
//! queries' tokens, the causal flash kernel over documents, tiled or dense masks, or a KV cache
//! while decoding. The drafter's layers use it with KV injection (keys from `[context, x]`).

use super::StepMask;
use crate::engine::model::fp8::Fp8Weight;
use crate::engine::model::layers::{
    apply_rope, attend, masked_attention, project, Linear, RmsNorm,
};
use crate::engine::model::shapes::Qwen3Config;
use crate::engine::model::tiled::{tiled_attention, AttnMask};
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    /// Qwen3's per-head norms of q and k (`Qwen3Config::qk_norm`); None in Llama and Qwen2.
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    /// [q; k; v] weights (and biases, where they have them) in one layer, the three
    /// projections' being views into it, once `fuse_projections` ran: one GEMM where queries,
    /// keys and values come from the same tokens.
    qkv: Option<Linear>,
}

impl Attention {
    pub fn new(p: nn::Path, cfg: &Qwen3Config) -> Attention {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        let (qkv_bias, o_bias) = (cfg.qkv_bias(), cfg.o_bias());
        let norm = |name: &str| {
            cfg.qk_norm()
                .then(|| RmsNorm::new(&p / name, d, cfg.rms_norm_eps))
        };
        Attention {
            q_proj: Linear::with_bias(&p / "q_proj", h, nq * d, qkv_bias),
            k_proj: Linear::with_bias(&p / "k_proj", h, nkv * d, qkv_bias),
            v_proj: Linear::with_bias(&p / "v_proj", h, nkv * d, qkv_bias),
            o_proj: Linear::with_bias(&p / "o_proj", nq * d, h, o_bias),
            q_norm: norm("q_norm"),
            k_norm: norm("k_norm"),
            heads: nq,
            kv_heads: nkv,
            head_dim: d,
            qkv: None,
        }
    }

    /// Puts the q, k and v weights in one tensor (for a frozen model, after its weights are
    /// loaded): a forward whose keys and values come from its queries' tokens then projects
    /// them with one GEMM. The k and v GEMMs alone are narrow (a 4096-wide model's are 1024
    /// outputs) and fill the GPU poorly.
    pub fn fuse_projections(&mut self) {
        let _g = tch::no_grad_guard();
        let parts = [&self.q_proj, &self.k_proj, &self.v_proj].map(|l| l.weight.detach());
        let fused = Tensor::cat(&parts, 0);
        let biases: Option<Vec<Tensor>> = [&self.q_proj, &self.k_proj, &self.v_proj]
            .iter()
            .map(|l| l.bias.as_ref().map(Tensor::detach))
            .collect();
        let fused_bias = biases.map(|b| Tensor::cat(&b, 0));
        let mut at = 0;
        for l in [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj] {
            let rows = l.weight.size()[0];
            l.weight.set_data(&fused.narrow(0, at, rows));
            if let (Some(b), Some(fb)) = (&mut l.bias, &fused_bias) {
                b.set_data(&fb.narrow(0, at, rows));
            }
            at += rows;
        }
        self.qkv = Some(Linear::of(fused, fused_bias));
    }

    /// The projections in FP8 (a frozen model's, after `fuse_projections`): the fused q/k/v
    /// weight quantized once, the three projections' views of its channels, and o's.
    pub fn quantize_fp8(&mut self) {
        if self.qkv.is_none() {
            self.fuse_projections();
        }
        self.o_proj.quantize_fp8();
        let Some(fused) = self.qkv.as_mut() else {
            return;
        };
        let parts = [&self.q_proj, &self.k_proj, &self.v_proj];
        if !Fp8Weight::fits(&fused.weight) || !parts.iter().all(|l| Fp8Weight::fits(&l.weight)) {
            return;
        }
        let w = Fp8Weight::quantize(&fused.weight);
        let mut at = 0;
        for l in [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj] {
            let rows = l.weight.size()[0];
            l.use_fp8(w.rows(at, rows));
            at += rows;
        }
        fused.use_fp8(w);
    }

    /// Queries from `x`; keys and values from `kv_sources` concatenated along the sequence, each
    /// projected with this layer's own k/v projections (the target passes `[x]`, the drafter
    /// `[context, x]`: KV injection).
    // x [b, lq, h], kv_sources [b, lk_i, h], rope tables [b, l, d], mask [b, 1, lq, lk] -> [b, lq, h]
    pub fn forward(
        &self,
        x: &Tensor,
        kv_sources: &[&Tensor],
        q_rope: (&Tensor, &Tensor),
        k_rope: (&Tensor, &Tensor),
        mask: &AttnMask,
    ) -> Tensor {
        // The fused kernel rotates q and k as it normalises them where both take one table
        // (the target's documents path).
        let documents = matches!(mask, AttnMask::Documents { .. });
        let block_spans = match mask {
            AttnMask::Tiled(m) => m.block_spans(),
            _ => None,
        };
        let one_table = same_tensor(q_rope.0, k_rope.0) && same_tensor(q_rope.1, k_rope.1);
        let (q, k, v, rotated) = match (&self.qkv, kv_sources) {
            (Some(w), [only]) if same_tensor(only, x) => {
                self.fused(x, w, (documents && one_table).then_some(q_rope))
            }
            // The block attention kernels take q and k sequence-major: the drafter's norms
            // and RoPE go through one trained kernel each way where it runs.
            _ if block_spans.is_some() => self.projected_and_rotated(x, kv_sources, q_rope, k_rope),
            _ => {
                let (q, k, v) = self.normed_projections(x, kv_sources);
                (q, k, v, false)
            }
        };
        // The sequence-major paths (documents, block attention) rotate q and k here unless a
        // kernel did; the others rotate them heads-major below.
        let (q, k) = if (documents || block_spans.is_some()) && !rotated {
            (
                apply_rope(&q, q_rope.0, q_rope.1, 2),
                apply_rope(&k, k_rope.0, k_rope.1, 2),
            )
        } else {
            (q, k)
        };
        let out = match (mask, block_spans) {
            (AttnMask::Documents { docs, window }, _) => docs
                .attention(&q, &k, &v, *window)
                .unwrap_or_else(|e| panic!("{e:#}")),
            // The block attention kernels where they run, else the tiled sdpa calls.
            (AttnMask::Tiled(m), Some((spans, docs))) => crate::engine::gpu::cuda::block_attention(
                &q, &k, &v, spans, docs,
            )
            .unwrap_or_else(|| {
                let heads = |t: &Tensor| t.transpose(1, 2);
                tiled_attention(&heads(&q), &heads(&k), &heads(&v), m).transpose(1, 2)
            }),
            _ => {
                let (q, k, v) = heads_major(&q, &k, &v, q_rope, k_rope);
                let out = match mask {
                    AttnMask::Tiled(m) => tiled_attention(&q, &k, &v, m),
                    _ => masked_attention(&q, &k, &v, &mask.dense()),
                };
                out.transpose(1, 2)
            }
        };
        self.output(x, &out)
    }

    /// `forward` for decoding with a cache: `x` holds the new tokens, `cache` the keys and values
    /// (after k_norm and RoPE, heads-major) of the tokens before them, and takes the new ones.
    // x [b, n, h], rope tables [b, n, d], mask [b, 1, n, past + n] -> [b, n, h]
    pub fn forward_cached(
        &self,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        mask: &StepMask,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Tensor {
        let (q, k, v) = self.normed_projections(x, &[x]);
        let (q, k, v) = heads_major(&q, &k, &v, rope, rope);
        let (k, v) = match cache.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        let sdpa = |mask: Option<&Tensor>, causal| {
            Tensor::scaled_dot_product_attention(&q, &k, &v, mask, 0.0, causal, None, true)
        };
        let out = match mask {
            StepMask::All => sdpa(None, false),
            StepMask::Causal => sdpa(None, true),
            StepMask::Masked { mask, blocked } => match blocked {
                Some(blocked) => attend(&q, &k, &v, mask, blocked),
                None => sdpa(Some(mask), false),
            },
        }
        .transpose(1, 2);
        *cache = Some((k, v));
        self.output(x, &out)
    }

    /// q, k and v through the fused projection, q and k normed, and rotated too where `rope`
    /// is given and the fused norm + RoPE kernel runs (the last value says whether they were).
    // x [b, l, h], w [q + 2 kv, h] -> q [b, l, heads, d], k, v [b, l, kv_heads, d]
    fn fused(
        &self,
        x: &Tensor,
        w: &Linear,
        rope: Option<(&Tensor, &Tensor)>,
    ) -> (Tensor, Tensor, Tensor, bool) {
        let (b, l) = (x.size()[0], x.size()[1]);
        let (nq, nkv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let qkv = w.forward(x);
        let part = |at, n, heads| qkv.narrow(2, at, n).view([b, l, heads, self.head_dim]);
        let v = part(nq + nkv, nkv, self.kv_heads);
        let norms = self.q_norm.as_ref().zip(self.k_norm.as_ref());
        if let (Some(tables), Some((q_norm, k_norm))) =
            (rope.filter(|_| self.head_dim == 128), norms)
        {
            let norm_rope = |col0, heads, norm: &RmsNorm| {
                crate::engine::gpu::cuda::norm_rope(
                    &qkv,
                    (col0, heads),
                    (&norm.weight, norm.eps()),
                    tables,
                )
            };
            if let Some(q) = norm_rope(0, self.heads, q_norm) {
                if let Some(k) = norm_rope(nq, self.kv_heads, k_norm) {
                    return (q, k, v, true);
                }
            }
        }
        (
            normed(&self.q_norm, part(0, nq, self.heads)),
            normed(&self.k_norm, part(nq, nkv, self.kv_heads)),
            v,
            false,
        )
    }

    /// q, k and v projected from `x` and `kv_sources` (`raw_projections`), q and k normed and
    /// rotated by one trained kernel each where it runs (the last value says whether they were:
    /// else they are normed only, as `normed_projections` gives them).
    // x [b, lq, h], kv_sources [b, lk_i, h] -> q [b, lq, heads, d], k, v [b, lk, kv_heads, d]
    fn projected_and_rotated(
        &self,
        x: &Tensor,
        kv_sources: &[&Tensor],
        q_rope: (&Tensor, &Tensor),
        k_rope: (&Tensor, &Tensor),
    ) -> (Tensor, Tensor, Tensor, bool) {
        let (q, k, v) = self.raw_projections(x, kv_sources);
        let norms = self.q_norm.as_ref().zip(self.k_norm.as_ref());
        if let Some((q_norm, k_norm)) = norms.filter(|_| self.head_dim == 128) {
            let trained = |t: &Tensor, norm: &RmsNorm, tables: (&Tensor, &Tensor)| {
                crate::engine::gpu::cuda::norm_rope_trained(t, (&norm.weight, norm.eps()), tables)
            };
            if let Some(qr) = trained(&q, q_norm, q_rope) {
                if let Some(kr) = trained(&k, k_norm, k_rope) {
                    return (qr, kr, v, true);
                }
            }
        }
        (normed(&self.q_norm, q), normed(&self.k_norm, k), v, false)
    }

    /// `raw_projections` with q and k through their per-head norms (Qwen3's).
    fn normed_projections(&self, x: &Tensor, sources: &[&Tensor]) -> (Tensor, Tensor, Tensor) {
        let (q, k, v) = self.raw_projections(x, sources);
        (normed(&self.q_norm, q), normed(&self.k_norm, k), v)
    }

    /// q from `x`, k and v from `kv_sources` concatenated along the sequence, before the norms:
    /// each source projected once by the weights it feeds (`x`, where it is a source, by q, k
    /// and v together), so that a drafter step accumulates each input's and weight's gradient
    /// in the GEMMs (`layers::project`).
    // x [b, lq, h], sources [b, l_i, h] -> q [b, lq, heads, d], k, v [b, sum l_i, kv_heads, d]
    fn raw_projections(&self, x: &Tensor, sources: &[&Tensor]) -> (Tensor, Tensor, Tensor) {
        let (b, lq) = (x.size()[0], x.size()[1]);
        let mut q = None;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for s in sources {
            let mut parts = if same_tensor(s, x) && q.is_none() {
                let mut qkv = project(s, &[&self.q_proj, &self.k_proj, &self.v_proj]);
                q = Some(qkv.remove(0));
                qkv
            } else {
                project(s, &[&self.k_proj, &self.v_proj])
            };
            vs.push(parts.pop().expect("v"));
            ks.push(parts.pop().expect("k"));
        }
        let q = q.unwrap_or_else(|| self.q_proj.forward(x));
        // One source: its projections as they are (a concatenation of one would copy them).
        let joined = |mut parts: Vec<Tensor>| match parts.len() {
            1 => parts.remove(0),
            _ => Tensor::cat(&parts, 1),
        };
        let heads = |t: Tensor| t.view([b, -1, self.kv_heads, self.head_dim]);
        (
            q.view([b, lq, self.heads, self.head_dim]),
            heads(joined(ks)),
            heads(joined(vs)),
        )
    }

    // out [b, lq, heads, d] -> [b, lq, h]
    fn output(&self, x: &Tensor, out: &Tensor) -> Tensor {
        let (b, lq) = (x.size()[0], x.size()[1]);
        self.o_proj
            .forward(&out.reshape([b, lq, self.heads * self.head_dim]))
    }
}

/// `x` through the per-head norm where the model has one.
fn normed(norm: &Option<RmsNorm>, x: Tensor) -> Tensor {
    match norm {
        Some(n) => n.forward(&x),
        None => x,
    }
}

/// Whether `a` and `b` are the same values: one storage, offset and shape.
fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.data_ptr() == b.data_ptr() && a.size() == b.size() && a.stride() == b.stride()
}

/// q, k, v from sequence-major [b, l, heads, d] to heads-major [b, heads, l, d], q and k rotated.
fn heads_major(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    q_rope: (&Tensor, &Tensor),
    k_rope: (&Tensor, &Tensor),
) -> (Tensor, Tensor, Tensor) {
    (
        apply_rope(&q.transpose(1, 2), q_rope.0, q_rope.1, 1),
        apply_rope(&k.transpose(1, 2), k_rope.0, k_rope.1, 1),
        v.transpose(1, 2),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::qwen3::Qwen3Target;
    use crate::engine::train::presets::Preset;
    use tch::{Device, Kind};

    fn attn_fused_numel(target: &Qwen3Target) -> i64 {
        target.layers[0]
            .self_attn
            .qkv
            .as_ref()
            .unwrap()
            .weight
            .numel() as i64
    }

    /// The fused q/k/v projection gives the forward it replaces (a wrong split — k and v
    /// swapped, a misplaced offset — changes it), and the three weights keep their values.
    #[test]
    fn fused_projections_give_the_same_forward() {
        tch::manual_seed(4);
        let p = Preset::by_name("tiny").unwrap();
        let spec = p.drafter_spec(&p.target);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut target = Qwen3Target::new(&vs.root(), &p.target, &spec.target_layer_ids, 0.5);
        let (b, s) = (2, 24);
        let ids = Tensor::randint(500, [b, s], (Kind::Int64, Device::Cpu));
        let docs = Tensor::cat(
            &[
                Tensor::zeros([b, s / 2], (Kind::Int64, Device::Cpu)),
                Tensor::ones([b, s / 2], (Kind::Int64, Device::Cpu)),
            ],
            1,
        );
        let pos = Tensor::arange(s, (Kind::Int64, Device::Cpu))
            .unsqueeze(0)
            .repeat([b, 1]);
        let q_before = target.layers[0].self_attn.q_proj.weight.copy();
        let before = tch::no_grad(|| target.forward(&ids, &pos, &docs));
        target.fuse_projections();
        let after = tch::no_grad(|| target.forward(&ids, &pos, &docs));
        assert!(target.layers[0].self_attn.qkv.is_some());
        assert!(target.layers[0].self_attn.q_proj.weight.equal(&q_before));
        let gap = f64::try_from((&after - &before).abs().max()).unwrap();
        assert!(gap < 1e-5, "fused forward differs by {gap}");

        // In FP8 every projection's own weight is given back (the VarStore's tensors are empty),
        // the forward stays within e4m3's rounding of the bf16 one, and q, k and v (read through
        // the unfused path, as decoding does) are views of the fused e4m3 weight's channels.
        target.quantize_fp8();
        let empty: Vec<String> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.numel() == 0)
            .map(|(n, _)| n)
            .collect();
        let projections =
            crate::engine::model::qwen3::built_layers(&p.target, &spec.target_layer_ids) * 7;
        assert_eq!(empty.len() as i64, projections, "{empty:?}");
        assert!(
            empty.iter().all(|n| n.ends_with("_proj.weight")),
            "{empty:?}"
        );
        // The fused weight, which the VarStore does not hold, is given back too.
        assert_eq!(attn_fused_numel(&target), 0);
        let fp8 = tch::no_grad(|| target.forward(&ids, &pos, &docs));
        let rel = f64::try_from((&fp8 - &before).norm() / before.norm()).unwrap();
        assert!(
            rel > 1e-4 && rel < 0.05,
            "FP8 forward {rel} from the bf16 one"
        );
        let attn = &target.layers[0].self_attn;
        let x = Tensor::randn([1, 3, p.target.hidden_size], (Kind::Float, Device::Cpu));
        let fused = attn.qkv.as_ref().unwrap().forward(&x);
        let q = attn.q_proj.forward(&x);
        assert!(q.equal(&fused.narrow(2, 0, q.size()[2])));
    }
}
