//! The named model shapes with random weights (`--preset`), each with its own recipe: the
//! training settings of runs without `--target`.

use crate::engine::model::shapes::{drafter_spec_for, Arch, DrafterSpec, Qwen3Config};
use crate::engine::train::blocks::AnchorScope;
use crate::engine::train::recipe::Recipe;
use anyhow::{bail, Result};

/// A named model shape with random weights, for runs without `--target`. Its recipe applies
/// only to those runs: a `--target` run takes SpecForge's (`Recipe::specforge`).
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: &'static str,
    pub target: Qwen3Config,
    pub mask_token_id: i64,
    /// SpecForge's for the Qwen3 shapes; tiny's is sized for a CPU (and learns faster with a
    /// larger lr).
    pub recipe: Recipe,
    /// Std of the random embedding / lm-head init (HF uses 0.02; tiny needs larger logits).
    pub embed_std: f64,
}

pub const PRESETS: [&str; 6] = [
    "tiny",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
];

fn qwen3(hidden: i64, inter: i64, layers: i64, heads: i64, kv: i64, tie: bool) -> Qwen3Config {
    Qwen3Config {
        hidden_size: hidden,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        vocab_size: 151_936,
        tie_word_embeddings: tie,
        max_position_embeddings: Some(40_960),
        layer_types: None,
        sliding_window: None,
        model_type: Arch::Qwen3,
        attention_bias: false,
        mlp_bias: false,
        rope_llama3: None,
    }
}

/// A released Qwen3 shape with a 5-layer drafter and SpecForge's training defaults.
fn qwen3_preset(name: &'static str, target: Qwen3Config) -> Preset {
    Preset {
        name,
        target,
        mask_token_id: 151_669,
        recipe: Recipe::specforge(),
        embed_std: 0.02,
    }
}

impl Preset {
    pub fn by_name(name: &str) -> Result<Preset> {
        Ok(match name {
            // Small enough that a training step takes well under a second on 2 CPU cores.
            "tiny" => Preset {
                name: "tiny",
                target: Qwen3Config {
                    hidden_size: 128,
                    intermediate_size: 384,
                    num_hidden_layers: 6,
                    num_attention_heads: 4,
                    num_key_value_heads: 2,
                    head_dim: 32,
                    rms_norm_eps: 1e-6,
                    rope_theta: 10_000.0,
                    vocab_size: 512,
                    tie_word_embeddings: false,
                    max_position_embeddings: Some(4096),
                    layer_types: None,
                    sliding_window: None,
                    model_type: Arch::Qwen3,
                    attention_bias: false,
                    mlp_bias: false,
                    rope_llama3: None,
                },
                mask_token_id: 511,
                recipe: Recipe {
                    drafter_layers: 2,
                    block_size: 16,
                    seq_len: 256,
                    batch: 2,
                    anchors: 16,
                    anchor_scope: AnchorScope::PerRow,
                    steps_per_batch: 1,
                    lr: 3e-3,
                },
                embed_std: 0.5,
            },
            "qwen3-0.6b" => qwen3_preset("qwen3-0.6b", qwen3(1024, 3072, 28, 16, 8, true)),
            "qwen3-4b" => qwen3_preset("qwen3-4b", qwen3(2560, 9728, 36, 32, 8, true)),
            "qwen3-8b" => qwen3_preset("qwen3-8b", qwen3(4096, 12288, 36, 32, 8, false)),
            "qwen3-14b" => qwen3_preset("qwen3-14b", qwen3(5120, 17408, 40, 40, 8, false)),
            // 65 GB of bf16 weights: the target wants a GPU of its own (docs/usage.md).
            "qwen3-32b" => qwen3_preset("qwen3-32b", qwen3(5120, 25600, 64, 64, 8, false)),
            other => bail!(
                "unknown preset `{other}` for --preset: use one of {}",
                PRESETS.join(", ")
            ),
        })
    }

    /// The drafter for this target: Qwen3 layers of the target's width.
    pub fn drafter_spec(&self, target: &Qwen3Config) -> DrafterSpec {
        drafter_spec_for(
            target,
            self.recipe.drafter_layers,
            self.mask_token_id,
            self.recipe.block_size,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_preset_lists_the_known_ones() {
        let e = Preset::by_name("qwen9").unwrap_err().to_string();
        for name in ["qwen3-8b", "qwen3-14b", "qwen3-32b"] {
            assert!(e.contains("--preset") && e.contains(name), "{e}");
        }
        for name in PRESETS {
            assert_eq!(Preset::by_name(name).unwrap().name, name);
        }
    }

    /// The larger presets against Qwen/Qwen3-14B's and Qwen/Qwen3-32B's config.json on Hugging
    /// Face, key by key, and their drafters' target layers by the rule, counted by hand.
    #[test]
    fn the_14b_and_32b_presets_are_the_public_configs() {
        for (name, intermediate_size, num_hidden_layers, num_attention_heads, layer_ids) in [
            // 40 layers: round(1 + i x 36 / 4) = 1 + 9i.
            ("qwen3-14b", 17408, 40, 40, [1, 10, 19, 28, 37]),
            // 64 layers: round(1 + i x 60 / 4) = 1 + 15i.
            ("qwen3-32b", 25600, 64, 64, [1, 16, 31, 46, 61]),
        ] {
            let p = Preset::by_name(name).unwrap();
            let t = &p.target;
            assert_eq!(t.hidden_size, 5120, "{name} hidden_size");
            assert_eq!(t.intermediate_size, intermediate_size, "{name}");
            assert_eq!(t.num_hidden_layers, num_hidden_layers, "{name}");
            assert_eq!(t.num_attention_heads, num_attention_heads, "{name}");
            assert_eq!(t.num_key_value_heads, 8, "{name} num_key_value_heads");
            assert_eq!(t.head_dim, 128, "{name} head_dim");
            assert_eq!(t.vocab_size, 151_936, "{name} vocab_size");
            assert!(!t.tie_word_embeddings, "{name} tie_word_embeddings");
            assert_eq!(t.rope_theta, 1_000_000.0, "{name} rope_theta");
            assert_eq!(t.rms_norm_eps, 1e-6, "{name} rms_norm_eps");
            assert_eq!(t.model_type, Arch::Qwen3, "{name} model_type");
            assert!(t.validate().is_ok(), "{name}");
            let spec = p.drafter_spec(t);
            assert_eq!(spec.target_layer_ids, layer_ids, "{name}");
            assert_eq!(spec.num_target_layers, num_hidden_layers, "{name}");
            // The drafter at the target's width, 5 layers.
            assert_eq!(spec.layers.hidden_size, 5120, "{name}");
            assert_eq!(spec.layers.intermediate_size, intermediate_size, "{name}");
            assert_eq!(spec.layers.num_hidden_layers, 5, "{name}");
        }
    }
}
