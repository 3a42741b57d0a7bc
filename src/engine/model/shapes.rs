//! Model configuration: a serde struct with config.json's own keys, the presets, and validation
//! that names the file and field at fault.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The decoder families a target can be, by config.json's `model_type`. One model code path runs
/// them all; what differs is config: Qwen3 normalises q and k per head (`q_norm`, `k_norm`);
/// Llama and Qwen2 do not; Qwen2 has q/k/v biases; Llama has `attention_bias` (q/k/v/o) and
/// `mlp_bias` flags and may scale its RoPE (`llama3`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    #[default]
    Qwen3,
    Llama,
    Qwen2,
}

/// The `model_type`s `--target` runs.
pub const MODEL_TYPES: [&str; 3] = ["qwen3", "llama", "qwen2"];

impl Arch {
    fn parse(model_type: &str) -> Option<Arch> {
        Some(match model_type {
            "qwen3" => Arch::Qwen3,
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            _ => return None,
        })
    }
}

/// Llama 3's RoPE frequency scaling (`rope_type: llama3`): the low frequencies divided by
/// `factor`, the high ones kept, a smooth blend between (transformers'
/// `_compute_llama3_parameters`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Llama3Rope {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: i64,
}

/// The rotary embedding of a model: its base and its scaling, if any.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub llama3: Option<Llama3Rope>,
}

impl Rope {
    /// Unscaled RoPE of base `theta`.
    pub fn plain(theta: f64) -> Rope {
        Rope {
            theta,
            llama3: None,
        }
    }
}

/// A decoder's config.json (the keys the target and the drafter read): Qwen3, Llama or Qwen2
/// (`model_type`; the drafter's layers are always Qwen3's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Qwen3Config {
    #[serde(default)]
    pub model_type: Arch,
    pub hidden_size: i64,
    pub intermediate_size: i64,
    pub num_hidden_layers: i64,
    pub num_attention_heads: i64,
    pub num_key_value_heads: i64,
    pub head_dim: i64,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub vocab_size: i64,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub max_position_embeddings: Option<i64>,
    /// `full_attention` or `sliding_attention` per layer; absent means all full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_types: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<i64>,
    /// Biases on the q, k, v and o projections (Llama's and Qwen3's key; Qwen2 has q/k/v
    /// biases whatever it says: `Qwen3Config::qkv_bias`).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP's projections (Llama's key).
    #[serde(default)]
    pub mlp_bias: bool,
    /// `rope_scaling` / `rope_parameters` of type `llama3`; None: plain RoPE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_llama3: Option<Llama3Rope>,
}

/// Raw config.json as read: every field optional, so a missing one becomes a sentence.
#[derive(Deserialize)]
struct RawConfig {
    model_type: Option<String>,
    hidden_size: Option<i64>,
    intermediate_size: Option<i64>,
    num_hidden_layers: Option<i64>,
    num_attention_heads: Option<i64>,
    num_key_value_heads: Option<i64>,
    head_dim: Option<i64>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_parameters: Option<serde_json::Value>,
    rope_scaling: Option<serde_json::Value>,
    vocab_size: Option<i64>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<i64>,
    layer_types: Option<Vec<String>>,
    sliding_window: Option<i64>,
    use_sliding_window: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
}

/// The RoPE scaling of `rope_scaling` or `rope_parameters`: none (`default`), `llama3` with its
/// four numbers, or a sentence refusing any other type (YaRN, linear, dynamic, ...): the target
/// and the drafter here rotate with plain or llama3 RoPE only, so such a model's hidden states
/// would differ from what it computes when it serves.
fn rope_scaling_of(raw: &RawConfig) -> Result<Option<Llama3Rope>> {
    let kind = |v: &serde_json::Value| {
        v.get("rope_type")
            .or_else(|| v.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("default")
            .to_string()
    };
    let scaled = [
        ("rope_scaling", raw.rope_scaling.as_ref()),
        ("rope_parameters", raw.rope_parameters.as_ref()),
    ]
    .into_iter()
    .filter_map(|(key, v)| Some((key, v?)))
    .filter(|(_, v)| !v.is_null())
    .map(|(key, v)| (key, kind(v), v))
    .find(|(_, k, _)| k != "default");
    let Some((key, k, v)) = scaled else {
        return Ok(None);
    };
    if k != "llama3" {
        bail!(
            "config.json asks for `{k}` RoPE scaling (`{key}`), which this trainer does not \
             apply (it runs plain and llama3 RoPE): hidden states would differ from the model's \
             own; use the model's unscaled config (scaling matters only past its original \
             context length, above the 3072 tokens a row holds here)"
        );
    }
    let num = |name: &str| {
        v.get(name).and_then(|x| x.as_f64()).with_context(|| {
            format!("config.json's `{key}` of type llama3 has no number `{name}`: add it")
        })
    };
    Ok(Some(Llama3Rope {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_max_position_embeddings: num("original_max_position_embeddings")? as i64,
    }))
}

impl Qwen3Config {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}: point the flag at a Hugging Face model directory",
                path.display()
            )
        })?;
        Self::from_json(&text).with_context(|| format!("in {}", path.display()))
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).context("config.json is not valid JSON")?;
        // Configs without the key (written by earlier versions of this program) are Qwen3's.
        let model_type = raw.model_type.as_deref().unwrap_or("qwen3");
        let arch = Arch::parse(model_type).with_context(|| {
            format!(
                "config.json has `model_type` `{model_type}`, which this trainer does not run: \
                 give a {} model",
                MODEL_TYPES.join(", ")
            )
        })?;
        fn need<T>(v: Option<T>, key: &str) -> Result<T> {
            v.with_context(|| {
                format!("config.json has no `{key}`: add it (a Hugging Face decoder config has it)")
            })
        }
        let hidden_size = need(raw.hidden_size, "hidden_size")?;
        let num_attention_heads = need(raw.num_attention_heads, "num_attention_heads")?;
        // transformers 5 moved rope_theta into rope_parameters.
        let rope_theta = raw.rope_theta.or_else(|| {
            raw.rope_parameters
                .as_ref()
                .and_then(|p| p.get("rope_theta"))
                .and_then(|v| v.as_f64())
        });
        let rope_llama3 = rope_scaling_of(&raw)?;
        let cfg = Qwen3Config {
            model_type: arch,
            hidden_size,
            intermediate_size: need(raw.intermediate_size, "intermediate_size")?,
            num_hidden_layers: need(raw.num_hidden_layers, "num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: raw.num_key_value_heads.unwrap_or(num_attention_heads),
            head_dim: raw
                .head_dim
                .unwrap_or(hidden_size / num_attention_heads.max(1)),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: need(rope_theta, "rope_theta")?,
            vocab_size: need(raw.vocab_size, "vocab_size")?,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: raw.max_position_embeddings,
            layer_types: raw.layer_types,
            // transformers' Qwen3Config keeps the window only with `use_sliding_window`; a
            // sliding layer without one is causal with no window (dflash runs it so).
            sliding_window: raw
                .sliding_window
                .filter(|_| raw.use_sliding_window.unwrap_or(false)),
            attention_bias: raw.attention_bias.unwrap_or(false),
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            rope_llama3,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
        ];
        for (k, v) in positive {
            if v <= 0 {
                bail!("`{k}` is {v}: it must be a positive integer");
            }
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            bail!(
                "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if self.head_dim % 2 != 0 {
            bail!(
                "`head_dim` ({}) must be even for rotary embeddings",
                self.head_dim
            );
        }
        if let Some(t) = &self.layer_types {
            if t.len() as i64 != self.num_hidden_layers {
                bail!(
                    "`layer_types` lists {} layers but `num_hidden_layers` is {}",
                    t.len(),
                    self.num_hidden_layers
                );
            }
            if let Some(bad) = t
                .iter()
                .find(|x| *x != "full_attention" && *x != "sliding_attention")
            {
                bail!("`layer_types` has `{bad}`: use full_attention or sliding_attention");
            }
        }
        Ok(())
    }

    /// Whether q and k are normalised per head before RoPE (Qwen3's `q_norm` and `k_norm`).
    pub fn qk_norm(&self) -> bool {
        self.model_type == Arch::Qwen3
    }

    /// Whether the q, k and v projections have biases (always in Qwen2).
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias || self.model_type == Arch::Qwen2
    }

    /// Whether the o projection has a bias (Qwen2's never has).
    pub fn o_bias(&self) -> bool {
        self.attention_bias && self.model_type != Arch::Qwen2
    }

    /// The model's rotary embedding.
    pub fn rope(&self) -> Rope {
        Rope {
            theta: self.rope_theta,
            llama3: self.rope_llama3,
        }
    }

    /// Whether layer `i` is a sliding-attention layer (causal; windowed when `window_of` says).
    pub fn is_sliding(&self, i: usize) -> bool {
        matches!(&self.layer_types, Some(t) if t.get(i).map(String::as_str) == Some("sliding_attention"))
    }

    /// The sliding window of layer `i`, if it is a sliding-attention layer with a window.
    pub fn window_of(&self, i: usize) -> Option<i64> {
        match &self.layer_types {
            Some(t) if t.get(i).map(String::as_str) == Some("sliding_attention") => {
                self.sliding_window
            }
            _ => None,
        }
    }
}

/// The drafter's own settings beside its Qwen3 layer shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct DrafterSpec {
    pub layers: Qwen3Config,
    pub target_layer_ids: Vec<i64>,
    pub block_size: i64,
    pub mask_token_id: i64,
    /// The mask token's text (`dflash_config.mask_token`, which older SGLang looks up): the
    /// tokenizer's added token, else `<|MASK|>`, the name a serving engine adds it under.
    pub mask_token: String,
    pub num_target_layers: i64,
}

/// The mask token's text when the tokenizer has none of its own.
pub const DEFAULT_MASK_TOKEN: &str = "<|MASK|>";

/// `build_target_layer_ids(L, n)`: n == 1 → [L/2]; else round(1 + i*(L-4)/(n-1)).
pub fn build_target_layer_ids(num_target_layers: i64, n: i64) -> Vec<i64> {
    if n == 1 {
        return vec![num_target_layers / 2];
    }
    let span = (num_target_layers - 4) as f64;
    (0..n)
        .map(|i| (1.0 + i as f64 * span / (n - 1) as f64).round_ties_even() as i64)
        .collect()
}

/// A fresh drafter's spec for a target: `n` layers, its target layers by the rule above. Its
/// layers are Qwen3's whatever the target is (DFlash's drafter is a Qwen3 model: q/k norms, no
/// MLP bias), with the target's width, heads, head_dim, intermediate size, norm epsilon, RoPE
/// (base and scaling) and `attention_bias`, all full attention: what SpecForge copies from a
/// target's config into the drafter's (docs/usage.md, Llama-family targets).
pub fn drafter_spec_for(
    target: &Qwen3Config,
    n: i64,
    mask_token_id: i64,
    block: i64,
) -> DrafterSpec {
    let mut layers = target.clone();
    layers.model_type = Arch::Qwen3;
    layers.mlp_bias = false;
    layers.num_hidden_layers = n;
    layers.layer_types = None;
    layers.sliding_window = None;
    DrafterSpec {
        layers,
        target_layer_ids: build_target_layer_ids(target.num_hidden_layers, n),
        block_size: block,
        mask_token_id,
        mask_token: DEFAULT_MASK_TOKEN.into(),
        num_target_layers: target.num_hidden_layers,
    }
}

#[cfg(test)]
mod tests;
