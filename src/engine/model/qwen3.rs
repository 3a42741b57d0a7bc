//! The target: a frozen decoder (Qwen3, Llama or Qwen2: `Qwen3Config::model_type`, the
//! differences are config) that returns the hidden states of chosen layers.
//! Module paths spell the Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`, …).
//! Each layer's self-attention, and the ways it runs, is in `attention`.

use super::layers::{prepare_mask, rope_tables, Mlp, RmsNorm};
use super::tiled::AttnMask;
use super::varlen::Varlen;
use crate::engine::model::shapes::Qwen3Config;
use tch::{nn, Tensor};

mod attention;
pub use attention::Attention;

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

    /// Its projections in FP8 (a frozen model's, once loaded).
    pub fn quantize_fp8(&mut self) {
        self.self_attn.quantize_fp8();
        self.mlp.quantize_fp8();
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

    /// The norm `x` goes through first.
    pub fn input_norm(&self) -> &RmsNorm {
        &self.input_layernorm
    }

    /// The block from `h` (`x` through the input norm): `x` after the attention's residual add,
    /// and the MLP's output, which the caller adds to it (the target and the drafter fuse that
    /// add into the next norm: `RmsNorm::add_forward`).
    pub fn attention_then_mlp(
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
        mask: &StepMask,
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

    /// `new`, each layer handed to `each` as soon as it is made and before the next one is: an
    /// FP8 target loads and quantizes it there, so that no more than one layer's bf16 weights
    /// are on the device at a time (src/engine/pipeline/parts.rs). The weights are drawn in the
    /// same order as `new` draws them.
    pub fn new_layer_by_layer(
        root: &nn::Path,
        cfg: &Qwen3Config,
        capture: &[i64],
        embed_std: f64,
        each: &mut dyn FnMut(i64, &mut DecoderLayer) -> anyhow::Result<()>,
    ) -> anyhow::Result<Qwen3Target> {
        let depth = built_layers(cfg, capture);
        Self::build_each(root, cfg, capture, depth, embed_std, each)
    }

    /// Each layer's q, k and v weights in one tensor (see `Attention::fuse_projections`): once
    /// the weights are loaded and final.
    pub fn fuse_projections(&mut self) {
        for layer in &mut self.layers {
            layer.self_attn.fuse_projections();
        }
    }

    /// Every layer's linear projections in FP8 (`--target-precision fp8`, src/engine/model/
    /// fp8.rs), once the weights are loaded and final: their bf16 memory is given back. The
    /// embedding, the norms and the lm head stay as they are.
    pub fn quantize_fp8(&mut self) {
        let _g = tch::no_grad_guard();
        for layer in &mut self.layers {
            layer.quantize_fp8();
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
        Self::build_each(root, cfg, capture, depth, embed_std, &mut |_, _| Ok(()))
            .expect("a build whose layers are left as made cannot fail")
    }

    fn build_each(
        root: &nn::Path,
        cfg: &Qwen3Config,
        capture: &[i64],
        depth: i64,
        embed_std: f64,
        each: &mut dyn FnMut(i64, &mut DecoderLayer) -> anyhow::Result<()>,
    ) -> anyhow::Result<Qwen3Target> {
        let model = root / "model";
        let embed_tokens = (&model / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            nn::Init::Randn {
                mean: 0.0,
                stdev: embed_std,
            },
        );
        let mut layers = Vec::new();
        for i in 0..depth {
            let mut layer = DecoderLayer::new(&model / "layers" / i, cfg);
            each(i, &mut layer)?;
            layers.push(layer);
        }
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
        Ok(Qwen3Target {
            cfg: cfg.clone(),
            embed_tokens,
            layers,
            capture: capture.to_vec(),
            norm,
            lm_head,
        })
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
        let (cos, sin) = rope_tables(&positions, self.cfg.head_dim, &self.cfg.rope(), kind);
        let mut x = self.embed_tokens.embedding_for(ids).to_kind(kind);
        let mut masks: Vec<(Option<i64>, StepMask)> = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let window = self.cfg.window_of(i);
            let at = match masks.iter().position(|(w, _)| *w == window) {
                Some(at) => at,
                None => {
                    masks.push((window, StepMask::new(start, n, window, pad.as_ref(), dev)));
                    masks.len() - 1
                }
            };
            x = layer.forward_cached(&x, (&cos, &sin), &masks[at].1, &mut cache.layers[i]);
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
        let (cos, sin) = rope_tables(positions, self.cfg.head_dim, &self.cfg.rope(), kind);
        // Only the captured layers' outputs are kept: at 32K tokens a row of Qwen3-8B each
        // layer's output is 256 MiB, 9 GiB for all 36.
        let mut kept: Vec<Option<Tensor>> = self.layers.iter().map(|_| None).collect();
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
            if self.capture.contains(&(i as i64)) {
                kept[i] = Some(x.shallow_clone());
            }
        }
        let out: Vec<Tensor> = self
            .capture
            .iter()
            .map(|id| {
                kept[*id as usize]
                    .as_ref()
                    .expect("every captured layer is built")
                    .shallow_clone()
            })
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

/// Which keys the new tokens of one cached step see: made once a step for all the layers of a
/// window (not once a layer), and no mask at all where none is needed.
#[derive(Debug)]
pub enum StepMask {
    /// Every key: one new token a row, no padding, no window that cuts the row.
    All,
    /// Causal from slot 0: the first step of rows without padding or a cutting window.
    Causal,
    /// A boolean mask [b or 1, 1, n, start + n], and the query rows that see no key (padding
    /// slots of a padded first step: their output is cleared, see `layers::attend`).
    Masked {
        mask: Tensor,
        blocked: Option<Tensor>,
    },
}

impl StepMask {
    fn new(
        start: i64,
        n: i64,
        window: Option<i64>,
        pad: Option<&Tensor>,
        dev: tch::Device,
    ) -> Self {
        let cut = window.is_some_and(|w| start + n > w);
        if pad.is_none() && !cut {
            if n == 1 {
                return StepMask::All;
            }
            if start == 0 {
                return StepMask::Causal;
            }
        }
        let mask = cached_causal_mask(start, n, window, pad, dev);
        if n == 1 {
            // A new token is never padding and sees itself.
            return StepMask::Masked {
                mask,
                blocked: None,
            };
        }
        let (mask, blocked) = prepare_mask(&mask);
        StepMask::Masked {
            mask,
            blocked: Some(blocked),
        }
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
