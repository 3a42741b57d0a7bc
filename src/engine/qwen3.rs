//! The target: a frozen Qwen3 decoder that returns the hidden states of chosen layers.
//! Module paths spell the Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`, …).

use super::config::Qwen3Config;
use super::layers::{apply_rope, masked_attention, rope_tables, Linear, Mlp, RmsNorm};
use super::tiled::{tiled_attention, AttnMask};
use super::varlen::Varlen;
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    /// [q; k; v] weights in one tensor (the three projections' weights are views into it) once
    /// `fuse_projections` ran: one GEMM where queries, keys and values come from the same tokens.
    qkv: Option<Tensor>,
}

impl Attention {
    pub fn new(p: nn::Path, cfg: &Qwen3Config) -> Attention {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nq, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Attention {
            q_proj: Linear::new(&p / "q_proj", h, nq * d),
            k_proj: Linear::new(&p / "k_proj", h, nkv * d),
            v_proj: Linear::new(&p / "v_proj", h, nkv * d),
            o_proj: Linear::new(&p / "o_proj", nq * d, h),
            q_norm: RmsNorm::new(&p / "q_norm", d, cfg.rms_norm_eps),
            k_norm: RmsNorm::new(&p / "k_norm", d, cfg.rms_norm_eps),
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
        let mut at = 0;
        for l in [&mut self.q_proj, &mut self.k_proj, &mut self.v_proj] {
            let rows = l.weight.size()[0];
            l.weight.set_data(&fused.narrow(0, at, rows));
            at += rows;
        }
        self.qkv = Some(fused);
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
        let one_table = same_tensor(q_rope.0, k_rope.0) && same_tensor(q_rope.1, k_rope.1);
        let (q, k, v, rotated) = match (&self.qkv, kv_sources) {
            (Some(w), [only]) if same_tensor(only, x) => {
                self.fused(x, w, (documents && one_table).then_some(q_rope))
            }
            _ => {
                let (k, v) = self.keys_values(kv_sources);
                (self.queries(x), k, v, false)
            }
        };
        let out = match mask {
            AttnMask::Documents { docs, window } => {
                let (q, k) = if rotated {
                    (q, k)
                } else {
                    (
                        apply_rope(&q, q_rope.0, q_rope.1, 2),
                        apply_rope(&k, k_rope.0, k_rope.1, 2),
                    )
                };
                docs.attention(&q, &k, &v, *window)
                    .unwrap_or_else(|e| panic!("{e:#}"))
            }
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
        mask: &Tensor,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Tensor {
        let q = self.queries(x);
        let (k, v) = self.keys_values(&[x]);
        let (q, k, v) = heads_major(&q, &k, &v, rope, rope);
        let (k, v) = match cache.take() {
            Some((pk, pv)) => (Tensor::cat(&[pk, k], 2), Tensor::cat(&[pv, v], 2)),
            None => (k, v),
        };
        let out = masked_attention(&q, &k, &v, mask).transpose(1, 2);
        *cache = Some((k, v));
        self.output(x, &out)
    }

    /// q, k and v through the fused projection, q and k normed, and rotated too where `rope`
    /// is given and the fused norm + RoPE kernel runs (the last value says whether they were).
    // x [b, l, h], w [q + 2 kv, h] -> q [b, l, heads, d], k, v [b, l, kv_heads, d]
    fn fused(
        &self,
        x: &Tensor,
        w: &Tensor,
        rope: Option<(&Tensor, &Tensor)>,
    ) -> (Tensor, Tensor, Tensor, bool) {
        let (b, l) = (x.size()[0], x.size()[1]);
        let (nq, nkv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let qkv = x.matmul(&w.to_kind(x.kind()).tr());
        let part = |at, n, heads| qkv.narrow(2, at, n).view([b, l, heads, self.head_dim]);
        let v = part(nq + nkv, nkv, self.kv_heads);
        if let Some(tables) = rope.filter(|_| self.head_dim == 128) {
            let norm_rope = |col0, heads, norm: &RmsNorm| {
                super::cuda::norm_rope(&qkv, (col0, heads), (&norm.weight, norm.eps()), tables)
            };
            if let Some(q) = norm_rope(0, self.heads, &self.q_norm) {
                if let Some(k) = norm_rope(nq, self.kv_heads, &self.k_norm) {
                    return (q, k, v, true);
                }
            }
        }
        (
            self.q_norm.forward(&part(0, nq, self.heads)),
            self.k_norm.forward(&part(nq, nkv, self.kv_heads)),
            v,
            false,
        )
    }

    // x [b, l, h] -> [b, l, heads, d], normed
    fn queries(&self, x: &Tensor) -> Tensor {
        let (b, l) = (x.size()[0], x.size()[1]);
        let q = self
            .q_proj
            .forward(x)
            .view([b, l, self.heads, self.head_dim]);
        self.q_norm.forward(&q)
    }

    // sources [b, l_i, h] -> k, v [b, sum l_i, kv_heads, d]; k normed
    fn keys_values(&self, sources: &[&Tensor]) -> (Tensor, Tensor) {
        let b = sources[0].size()[0];
        let heads = |t: Tensor| t.view([b, -1, self.kv_heads, self.head_dim]);
        // One source: its projections as they are (a concatenation of one would copy them).
        let project = |proj: &Linear| match sources {
            [only] => proj.forward(only),
            _ => {
                let parts: Vec<Tensor> = sources.iter().map(|s| proj.forward(s)).collect();
                Tensor::cat(&parts, 1)
            }
        };
        let k = self.k_norm.forward(&heads(project(&self.k_proj)));
        (k, heads(project(&self.v_proj)))
    }

    // out [b, lq, heads, d] -> [b, lq, h]
    fn output(&self, x: &Tensor, out: &Tensor) -> Tensor {
        let (b, lq) = (x.size()[0], x.size()[1]);
        self.o_proj
            .forward(&out.reshape([b, lq, self.heads * self.head_dim]))
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

#[derive(Debug)]
pub struct DecoderLayer {
    pub self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    pub fn new(p: nn::Path, cfg: &Qwen3Config) -> DecoderLayer {
        DecoderLayer {
            self_attn: Attention::new(&p / "self_attn", cfg),
            mlp: Mlp::new(&p / "mlp", cfg),
            input_layernorm: RmsNorm::new(
                &p / "input_layernorm",
                cfg.hidden_size,
                cfg.rms_norm_eps,
            ),
            post_attention_layernorm: RmsNorm::new(
                &p / "post_attention_layernorm",
                cfg.hidden_size,
                cfg.rms_norm_eps,
            ),
        }
    }

    /// One pre-norm block. `context`, when given, is injected as extra keys/values (already
    /// normalised by the caller, never updated here).
    pub fn forward(
        &self,
        x: &Tensor,
        context: Option<&Tensor>,
        q_rope: (&Tensor, &Tensor),
        k_rope: (&Tensor, &Tensor),
        mask: &AttnMask,
    ) -> Tensor {
        let h = self.input_layernorm.forward(x);
        let (x, mlp_out) = self.attention_then_mlp(x, &h, context, q_rope, k_rope, mask);
        x + mlp_out
    }

    /// The block from `h` (`x` through the input norm): `x` after the attention's residual add,
    /// and the MLP's output, which the caller adds to it (the target fuses that add into the next
    /// layer's input norm: `RmsNorm::add_forward`).
    fn attention_then_mlp(
        &self,
        x: &Tensor,
        h: &Tensor,
        context: Option<&Tensor>,
        q_rope: (&Tensor, &Tensor),
        k_rope: (&Tensor, &Tensor),
        mask: &AttnMask,
    ) -> (Tensor, Tensor) {
        let sources: Vec<&Tensor> = match context {
            Some(c) => vec![c, h],
            None => vec![h],
        };
        let attn = self.self_attn.forward(h, &sources, q_rope, k_rope, mask);
        let (x, h) = self.post_attention_layernorm.add_forward(x, &attn);
        (x, self.mlp.forward(&h))
    }

    /// One pre-norm block over new tokens, with the keys and values of earlier ones in `cache`.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        mask: &Tensor,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Tensor {
        let h = self.input_layernorm.forward(x);
        let x = x + self.self_attn.forward_cached(&h, rope, mask, cache);
        let h = self.post_attention_layernorm.forward(&x);
        &x + self.mlp.forward(&h)
    }
}

/// Layers of the target a worker runs: up to the deepest captured one (at most all of them).
pub fn built_layers(cfg: &Qwen3Config, capture: &[i64]) -> i64 {
    let depth = capture.iter().copied().max().unwrap_or(0) + 1;
    depth.min(cfg.num_hidden_layers)
}

/// The frozen target model.
#[derive(Debug)]
pub struct Qwen3Target {
    pub cfg: Qwen3Config,
    pub embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    /// Decoder layers whose outputs are returned, in order.
    capture: Vec<i64>,
    norm: RmsNorm,
    pub lm_head: Tensor,
}

/// Keys and values of the tokens fed so far, per layer (for `Qwen3Target::logits`), for a batch
/// of rows whose prompts are padded on the left to one length.
#[derive(Debug, Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Slots fed so far (padding included): the slot of the next token.
    pub len: i64,
    /// Padding slots at the start of each row (empty: none in any row). A row's tokens take
    /// positions from 0 after its padding (RoPE depends only on their differences, but the same
    /// positions give the same rounding as the row alone), and no query sees a padding slot.
    pub left_pad: Vec<i64>,
}

impl KvCache {
    /// Keeps the rows `rows` (indices into the current batch, in order) and drops the others: a
    /// batch's finished rows leave it.
    pub fn keep_rows(&mut self, rows: &[i64]) {
        let Some(dev) = self.layers.iter().flatten().next().map(|(k, _)| k.device()) else {
            return;
        };
        let index = Tensor::from_slice(rows).to_device(dev);
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = k.index_select(0, &index);
            *v = v.index_select(0, &index);
        }
        if !self.left_pad.is_empty() {
            self.left_pad = rows.iter().map(|&r| self.left_pad[r as usize]).collect();
        }
    }
}

impl Qwen3Target {
    /// Builds the modules under `root` (names as in a HF checkpoint). Only the layers up to the
    /// deepest captured one are built: the rest cannot change the returned hidden states (our
    /// choice; a full forward would only cost time). `model.norm` is kept for checkpoint parity.
    pub fn new(root: &nn::Path, cfg: &Qwen3Config, capture: &[i64], embed_std: f64) -> Qwen3Target {
        Self::build(root, cfg, capture, built_layers(cfg, capture), embed_std)
    }

    /// Each layer's q, k and v weights in one tensor (see `Attention::fuse_projections`): once
    /// the weights are loaded and final.
    pub fn fuse_projections(&mut self) {
        for layer in &mut self.layers {
            layer.self_attn.fuse_projections();
        }
    }

    /// Every layer, for `logits` (generation): the whole model, not only its captured part.
    pub fn new_full(root: &nn::Path, cfg: &Qwen3Config, embed_std: f64) -> Qwen3Target {
        Self::build(root, cfg, &[], cfg.num_hidden_layers, embed_std)
    }

    fn build(
        root: &nn::Path,
        cfg: &Qwen3Config,
        capture: &[i64],
        depth: i64,
        embed_std: f64,
    ) -> Qwen3Target {
        let model = root / "model";
        let embed_tokens = (&model / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            nn::Init::Randn {
                mean: 0.0,
                stdev: embed_std,
            },
        );
        let layers = (0..depth)
            .map(|i| DecoderLayer::new(&model / "layers" / i, cfg))
            .collect();
        let norm = RmsNorm::new(&model / "norm", cfg.hidden_size, cfg.rms_norm_eps);
        let lm_head = if cfg.tie_word_embeddings {
            embed_tokens.shallow_clone()
        } else {
            (root / "lm_head").var(
                "weight",
                &[cfg.vocab_size, cfg.hidden_size],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: embed_std,
                },
            )
        };
        Qwen3Target {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            capture: capture.to_vec(),
            norm,
            lm_head,
        }
    }

    /// Next-token logits (f32) after feeding `ids` at positions `cache.len()..`, the keys and
    /// values of earlier tokens taken from `cache` and the new ones added to it. Needs every layer
    /// (`new_full`).
    // ids [b, n] -> [b, vocab] (after the last of the n)
    pub fn next_logits(&self, ids: &Tensor, cache: &mut KvCache) -> Tensor {
        let (b, n) = (ids.size()[0], ids.size()[1]);
        let dev = ids.device();
        if cache.layers.len() != self.layers.len() {
            cache.layers = (0..self.layers.len()).map(|_| None).collect();
        }
        let start = cache.len;
        let slots = Tensor::arange_start(start, start + n, (tch::Kind::Int64, dev)).unsqueeze(0);
        let pad = (!cache.left_pad.is_empty()).then(|| {
            Tensor::from_slice(&cache.left_pad)
                .to_device(dev)
                .unsqueeze(1)
        });
        let positions = match &pad {
            Some(p) => (&slots - p).clamp_min(0),
            None => slots.expand([b, n], false),
        };
        let kind = self.embed_tokens.kind();
        let (cos, sin) = rope_tables(&positions, self.cfg.head_dim, self.cfg.rope_theta, kind);
        let mut x = self.embed_tokens.embedding_for(ids).to_kind(kind);
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = cached_causal_mask(start, n, self.cfg.window_of(i), pad.as_ref(), dev);
            x = layer.forward_cached(&x, (&cos, &sin), &mask, &mut cache.layers[i]);
        }
        cache.len += n;
        // Only the last slot's logits are asked for: the head over one token a row.
        let x = self.norm.forward(&x.select(1, -1));
        x.matmul(&self.lm_head.to_kind(x.kind()).tr())
            .to_kind(tch::Kind::Float)
    }

    /// Hidden states of the captured layers, concatenated on the last axis.
    /// The attention mask is causal within each document of the packed rows.
    // input_ids, positions, doc_ids [b, s] -> [b, s, n * hidden]
    pub fn forward(&self, input_ids: &Tensor, positions: &Tensor, doc_ids: &Tensor) -> Tensor {
        let mut masks: Vec<(Option<i64>, Tensor)> = Vec::new();
        self.forward_with(input_ids, positions, |window| {
            let mask = match masks.iter().find(|(w, _)| *w == window) {
                Some((_, m)) => m.shallow_clone(),
                None => {
                    let m = document_causal_mask(doc_ids, window);
                    masks.push((window, m.shallow_clone()));
                    m
                }
            };
            AttnMask::Dense(mask)
        })
    }

    /// `forward` through a causal flash kernel over the documents (`Varlen::usable` says where
    /// it runs): the same hidden states without building or reading a mask.
    pub fn forward_documents(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        docs: &Varlen,
    ) -> Tensor {
        self.forward_with(input_ids, positions, |window| AttnMask::Documents {
            docs: docs.share(),
            window,
        })
    }

    fn forward_with(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mut mask_for: impl FnMut(Option<i64>) -> AttnMask,
    ) -> Tensor {
        let kind = self.embed_tokens.kind();
        let mut x = self.embed_tokens.embedding_for(input_ids).to_kind(kind);
        let (cos, sin) = rope_tables(positions, self.cfg.head_dim, self.cfg.rope_theta, kind);
        let mut layer_out = Vec::with_capacity(self.layers.len());
        // Each residual add goes into the norm after it: the next layer's input norm.
        let mut h = match self.layers.first() {
            Some(first) => first.input_layernorm.forward(&x),
            None => x.shallow_clone(),
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = mask_for(self.cfg.window_of(i));
            let rope = (&cos, &sin);
            let (mid, mlp_out) = layer.attention_then_mlp(&x, &h, None, rope, rope, &mask);
            match self.layers.get(i + 1) {
                Some(next) => (x, h) = next.input_layernorm.add_forward(&mid, &mlp_out),
                None => x = mid + mlp_out,
            }
            layer_out.push(x.shallow_clone());
        }
        let out: Vec<Tensor> = self
            .capture
            .iter()
            .map(|id| layer_out[*id as usize].shallow_clone())
            .collect();
        Tensor::cat(&out, -1)
    }
}

trait EmbeddingFor {
    fn embedding_for(&self, ids: &Tensor) -> Tensor;
}

impl EmbeddingFor for Tensor {
    fn embedding_for(&self, ids: &Tensor) -> Tensor {
        Tensor::embedding(self, ids, -1, false, false)
    }
}

/// The mask of `n` new queries in slots `start..start + n` over keys `0..start + n`: causal,
/// (sliding layers) within the window, and blind to each row's left padding (`pad` [b, 1]).
// -> [1 or b, 1, n, start + n] bool
fn cached_causal_mask(
    start: i64,
    n: i64,
    window: Option<i64>,
    pad: Option<&Tensor>,
    dev: tch::Device,
) -> Tensor {
    let q = Tensor::arange_start(start, start + n, (tch::Kind::Int64, dev)).unsqueeze(1);
    let k = Tensor::arange(start + n, (tch::Kind::Int64, dev)).unsqueeze(0);
    let mut m = k.le_tensor(&q);
    if let Some(w) = window {
        m = m.logical_and(&(&q - &k).lt(w));
    }
    let m = m.view([1, 1, n, start + n]);
    match pad {
        // [b, 1] -> keys at or after the padding, [b, 1, 1, start + n]
        Some(p) => m.logical_and(&k.ge_tensor(p).view([-1, 1, 1, start + n])),
        None => m,
    }
}

/// Causal attention within a document: query i sees key j when doc(i) == doc(j), j <= i, and
/// (sliding layers) i - j < window.
// doc_ids [b, s] -> [b, 1, s, s] bool
pub fn document_causal_mask(doc_ids: &Tensor, window: Option<i64>) -> Tensor {
    let s = doc_ids.size()[1];
    let idx = Tensor::arange(s, (tch::Kind::Int64, doc_ids.device()));
    let qi = idx.unsqueeze(1);
    let kj = idx.unsqueeze(0);
    let mut m = kj.le_tensor(&qi);
    if let Some(w) = window {
        m = m.logical_and(&(&qi - &kj).lt(w));
    }
    let same = doc_ids.unsqueeze(2).eq_tensor(&doc_ids.unsqueeze(1));
    same.logical_and(&m.unsqueeze(0)).unsqueeze(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::config::Preset;
    use tch::{Device, Kind};

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
    }
}
