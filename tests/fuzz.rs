//! Every parser of user input, fuzzed: arbitrary and near-valid inputs end in `Ok` or an error
//! sentence, never a panic. 64 cases per parser by default (a few seconds in all); a long run:
//! `PROPTEST_CASES=20000 cargo test --test all fuzz` (see the README).

use dflash_top::cli::TrainArgs;
use dflash_top::config::{parse_devices, parse_slow, RunConfig};
use dflash_top::engine::checkpoint::read_drafter_spec;
use dflash_top::engine::config::Qwen3Config;
use dflash_top::engine::data::{DocSource, JsonlOptions, JsonlSource};
use dflash_top::engine::optim::AdamW;
use dflash_top::engine::weights::read_all;
use dflash_top::telemetry::record::read_recording;
use proptest::prelude::*;
use std::path::Path;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An error must be a sentence: non-empty, one that names what it is about.
fn sentence(e: anyhow::Error) {
    let msg = format!("{e:#}");
    assert!(!msg.trim().is_empty());
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A JSON scalar or small array, as text: the values near-valid inputs are made of.
fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (-4i64..5000).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "[a-z_:,0-9 ]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("true".to_string()),
        Just("null".to_string()),
        prop::collection::vec(-3i64..300, 0..6).prop_map(|v| format!("{v:?}")),
    ]
}

const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "vocab_size",
    "tie_word_embeddings",
    "layer_types",
    "sliding_window",
    "num_target_layers",
    "block_size",
    "dflash_config",
    "target_layer_ids",
    "mask_token_id",
    "rope_parameters",
];

/// A JSON object over the config.json keys, with arbitrary values.
fn config_json() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(CONFIG_KEYS), json_value()), 0..18).prop_map(|kv| {
        let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", body.join(", "))
    })
}

const TOML_KEYS: &[&str] = &[
    "preset",
    "data",
    "steps",
    "save_every",
    "target_devices",
    "drafter_devices",
    "seed",
    "batch",
    "seq_len",
    "anchors",
    "lr",
    "batch_queue",
    "hs_queue",
    "threads_per_worker",
    "slow",
    "interval",
    "gpu_timing",
    "profiling",
    "loss_chunk_mib",
    "keep",
    "max_nonfinite",
    "typo_key",
];

fn toml_text() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(TOML_KEYS), json_value()), 0..10).prop_map(|kv| {
        kv.iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
    })
}

/// A safetensors file: an 8-byte header length (right or not), a JSON header, data bytes.
fn safetensors_bytes() -> impl Strategy<Value = Vec<u8>> {
    let entry = (
        "[a-z.]{1,8}",
        prop::sample::select(&["F32", "F16", "BF16", "I64", "U8", "BOOL", "X9"][..]),
        prop::collection::vec(0usize..5, 0..3),
        (0usize..64, 0usize..64),
    );
    (
        prop::collection::vec(entry, 0..4),
        prop::collection::vec(any::<u8>(), 0..96),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(entries, data, right_len, len)| {
            let body: Vec<String> = entries
                .iter()
                .map(|(n, d, shape, (a, b))| {
                    format!(r#""{n}": {{"dtype": "{d}", "shape": {shape:?}, "data_offsets": [{a}, {b}]}}"#)
                })
                .collect();
            let header = format!("{{{}}}", body.join(", ")).into_bytes();
            let n = if right_len { header.len() as u64 } else { len };
            let mut out = n.to_le_bytes().to_vec();
            out.extend(header);
            out.extend(data);
            out
        })
}

fn jsonl_line() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        (
            prop::collection::vec(json_value(), 0..8),
            prop::option::of(prop::collection::vec(json_value(), 0..8))
        )
            .prop_map(|(ids, mask)| {
                let ids = format!("[{}]", ids.join(","));
                match mask {
                    Some(m) => format!(r#"{{"input_ids": {ids}, "loss_mask": [{}]}}"#, m.join(",")),
                    None => format!(r#"{{"input_ids": {ids}}}"#),
                }
            }),
        prop::collection::vec(-2i64..200, 0..40)
            .prop_map(|ids| format!(r#"{{"input_ids": {ids:?}}}"#)),
        json_value().prop_map(|v| format!(r#"{{"text": {v}}}"#)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_toml_run_config(text in prop_oneof![toml_text(), ".{0,80}"]) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "run.toml", text.as_bytes());
        let args = TrainArgs { config: Some(path), ..Default::default() };
        if let Err(e) = RunConfig::from_args(&args) {
            let msg = format!("{e:#}");
            prop_assert!(msg.contains("run.toml") || msg.contains('`') || msg.contains("--"), "{msg}");
        }
    }

    #[test]
    fn fuzz_config_json(text in prop_oneof![config_json(), ".{0,60}"]) {
        if let Err(e) = Qwen3Config::from_json(&text) { sentence(e) }
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "config.json", text.as_bytes());
        if let Err(e) = read_drafter_spec(dir.path()) {
            prop_assert!(format!("{e:#}").contains("config.json"), "{e:#}");
        }
        if let Err(e) = Qwen3Config::from_dir(dir.path()) {
            prop_assert!(format!("{e:#}").contains("config.json"), "{e:#}");
        }
    }

    #[test]
    fn fuzz_safetensors_headers(
        bytes in prop_oneof![safetensors_bytes(), prop::collection::vec(any::<u8>(), 0..64)]
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "model.safetensors", &bytes);
        if let Err(e) = read_all(dir.path()) {
            prop_assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}");
        }
        let mut opt = AdamW::new(vec![("w".into(), tch::Tensor::zeros([2, 2], tch::kind::FLOAT_CPU))]);
        if let Err(e) = opt.load(&path) {
            prop_assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}");
        }
    }

    #[test]
    fn fuzz_jsonl_data_lines(lines in prop::collection::vec(jsonl_line(), 0..6)) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "data.jsonl", lines.join("\n").as_bytes());
        // Opened and read through twice, by the loader itself and by a reading thread: any
        // error names the file.
        for threads in [0, 1] {
            let opts = JsonlOptions { seed: Some(3), threads, ..JsonlOptions::new(151) };
            let read = JsonlSource::open(&path, opts)
                .and_then(|mut s| (0..2 * lines.len()).try_for_each(|_| s.next_doc().map(drop)));
            if let Err(e) = read {
                prop_assert!(format!("{e:#}").contains("data.jsonl"), "{e:#}");
            }
        }
    }

    #[test]
    fn fuzz_recordings(cut in 0usize..4000, flip in any::<(usize, u8)>(), junk in ".{0,40}") {
        let good = serde_json::to_string(&crate::tui::starved_snapshot()).unwrap();
        let mut bytes = good.clone().into_bytes();
        bytes.truncate(cut.min(bytes.len()));
        if !bytes.is_empty() {
            let i = flip.0 % bytes.len();
            bytes[i] = flip.1;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in [
            ("cut.jsonl", bytes),
            ("junk.jsonl", format!("{good}\n{junk}\n").into_bytes()),
        ] {
            let path = write(dir.path(), name, &content);
            if let Err(e) = read_recording(&path) {
                prop_assert!(format!("{e:#}").contains(name), "{e:#}");
            }
        }
    }

    #[test]
    fn fuzz_slow_and_device_lists(
        items in prop::collection::vec(
            prop_oneof!["(loader|target|drafter|gpu)=[0-9.]{0,6}(ms|us|s|x)?", ".{0,12}"],
            0..4
        ),
        list in prop_oneof!["((cpu|cuda|cuda:[0-9]{1,20}|tpu|),?){0,4}", ".{0,16}"],
    ) {
        if let Err(e) = parse_slow(&items) {
            prop_assert!(format!("{e:#}").contains("--slow"), "{e:#}");
        }
        if let Err(e) = parse_devices(&list, "--drafter-devices") {
            prop_assert!(format!("{e:#}").contains("--drafter-devices"), "{e:#}");
        }
    }
}
