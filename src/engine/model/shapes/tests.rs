//! Tests of the models' shapes (src/engine/model/shapes.rs): config.json read, checked and named.

use super::*;

#[test]
fn target_layer_ids_follow_the_rule() {
    assert_eq!(build_target_layer_ids(36, 1), vec![18]);
    assert_eq!(build_target_layer_ids(36, 5), vec![1, 9, 17, 25, 33]);
    assert_eq!(build_target_layer_ids(28, 5), vec![1, 7, 13, 19, 25]);
    assert_eq!(build_target_layer_ids(6, 2), vec![1, 3]);
}

#[test]
fn a_missing_field_is_named() {
    let e = Qwen3Config::from_json(
        r#"{"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
            "rope_theta": 10000.0, "vocab_size": 16}"#,
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("intermediate_size"), "{e:#}");
}

#[test]
fn scaled_rope_is_refused_by_name_and_plain_rope_accepted() {
    let base = r#""hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "vocab_size": 16"#;
    let cfg = |extra: &str| Qwen3Config::from_json(&format!("{{{base}, {extra}}}"));
    for plain in [
        r#""rope_theta": 1e4, "rope_scaling": null"#,
        r#""rope_parameters": {"rope_type": "default", "rope_theta": 1e4}"#,
    ] {
        assert!(cfg(plain).is_ok(), "{plain}");
    }
    for (scaled, kind) in [
        (
            r#""rope_theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
            "yarn",
        ),
        (
            r#""rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}"#,
            "linear",
        ),
        (
            r#""rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}"#,
            "dynamic",
        ),
    ] {
        let e = format!("{:#}", cfg(scaled).unwrap_err());
        assert!(e.contains(&format!("`{kind}` RoPE scaling")), "{e}");
    }
}

#[test]
fn model_type_picks_the_family_and_an_unknown_one_is_named() {
    let base = r#""hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 2, "vocab_size": 16, "rope_theta": 1e4"#;
    let cfg = |extra: &str| Qwen3Config::from_json(&format!("{{{base}{extra}}}"));
    let qwen3 = cfg("").unwrap();
    assert_eq!(qwen3.model_type, Arch::Qwen3, "no model_type: Qwen3");
    assert!(qwen3.qk_norm() && !qwen3.qkv_bias() && !qwen3.o_bias());
    let llama =
        cfg(r#", "model_type": "llama", "attention_bias": true, "mlp_bias": true"#).unwrap();
    assert!(!llama.qk_norm() && llama.qkv_bias() && llama.o_bias() && llama.mlp_bias);
    assert_eq!(llama.head_dim, 4, "head_dim defaults to hidden / heads");
    let qwen2 = cfg(r#", "model_type": "qwen2""#).unwrap();
    assert!(!qwen2.qk_norm() && qwen2.qkv_bias() && !qwen2.o_bias());
    let e = format!("{:#}", cfg(r#", "model_type": "mistral""#).unwrap_err());
    assert!(
        e.contains("config.json") && e.contains("`mistral`") && e.contains("llama"),
        "{e}"
    );
}

#[test]
fn llama3_rope_is_read_and_its_numbers_required() {
    let base = r#""model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 16"#;
    let cfg = |extra: &str| Qwen3Config::from_json(&format!("{{{base}, {extra}}}"));
    let c = cfg(
        r#""rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
    )
    .unwrap();
    assert_eq!(c.rope_theta, 5e5);
    let s = c.rope_llama3.unwrap();
    assert_eq!((s.factor, s.original_max_position_embeddings), (32.0, 8192));
    let e = format!(
        "{:#}",
        cfg(r#""rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#)
            .unwrap_err()
    );
    assert!(
        e.contains("`rope_scaling`") && e.contains("low_freq_factor"),
        "{e}"
    );
}
