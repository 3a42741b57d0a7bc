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
        }
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
        let (b, lq) = (x.size()[0], x.size()[1]);
        let heads = |t: Tensor, n: i64| t.view([b, -1, n, self.head_dim]);
        // [b, l, n, d]: sequence-major, as the flash kernel takes them.
        let q = self
            .q_norm
            .forward(&heads(self.q_proj.forward(x), self.heads));
        let k_parts: Vec<Tensor> = kv_sources.iter().map(|s| self.k_proj.forward(s)).collect();
        let v_parts: Vec<Tensor> = kv_sources.iter().map(|s| self.v_proj.forward(s)).collect();
        let k = self
            .k_norm
            .forward(&heads(Tensor::cat(&k_parts, 1), self.kv_heads));
        let v = heads(Tensor::cat(&v_parts, 1), self.kv_heads);
        let out = match mask {
            AttnMask::Documents { docs, window } => {
                let q = apply_rope(&q, q_rope.0, q_rope.1, 2);
                let k = apply_rope(&k, k_rope.0, k_rope.1, 2);
                docs.attention(&q, &k, &v, *window)
                    .unwrap_or_else(|e| panic!("{e:#}"))
            }
            _ => {
                let q = apply_rope(&q.transpose(1, 2), q_rope.0, q_rope.1, 1);
                let k = apply_rope(&k.transpose(1, 2), k_rope.0, k_rope.1, 1);
                let v = v.transpose(1, 2);
                let out = match mask {
                    AttnMask::Tiled(m) => tiled_attention(&q, &k, &v, m),
                    _ => masked_attention(&q, &k, &v, &mask.dense()),
                };
                out.transpose(1, 2)
            }
        };
        self.o_proj
            .forward(&out.reshape([b, lq, self.heads * self.head_dim]))
    }
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
        let sources: Vec<&Tensor> = match context {
            Some(c) => vec![c, &h],
            None => vec![&h],
        };
        let x = x + self.self_attn.forward(&h, &sources, q_rope, k_rope, mask);
        let h = self.post_attention_layernorm.forward(&x);
        &x + self.mlp.forward(&h)
    }
}

/// The frozen target model.
#[derive(Debug)]
pub struct Qwen3Target {
    pub cfg: Qwen3Config,
    pub embed_tokens: Tensor,
    layers: Vec<DecoderLayer>,
    /// Decoder layers whose outputs are returned, in order.
    capture: Vec<i64>,
    pub lm_head: Tensor,
}

impl Qwen3Target {
    /// Builds the modules under `root` (names as in a HF checkpoint). Only the layers up to the
    /// deepest captured one are built: the rest cannot change the returned hidden states (our
    /// choice; a full forward would only cost time). `model.norm` is kept for checkpoint parity.
    pub fn new(root: &nn::Path, cfg: &Qwen3Config, capture: &[i64], embed_std: f64) -> Qwen3Target {
        let model = root / "model";
        let embed_tokens = (&model / "embed_tokens").var(
            "weight",
            &[cfg.vocab_size, cfg.hidden_size],
            nn::Init::Randn {
                mean: 0.0,
                stdev: embed_std,
            },
        );
        let depth = capture.iter().copied().max().unwrap_or(0) + 1;
        let layers = (0..depth.min(cfg.num_hidden_layers))
            .map(|i| DecoderLayer::new(&model / "layers" / i, cfg))
            .collect();
        let _norm = RmsNorm::new(&model / "norm", cfg.hidden_size, cfg.rms_norm_eps);
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
            lm_head,
        }
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
        for (i, layer) in self.layers.iter().enumerate() {
            let mask = mask_for(self.cfg.window_of(i));
            x = layer.forward(&x, None, (&cos, &sin), (&cos, &sin), &mask);
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
