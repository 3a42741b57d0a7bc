//! Llama-family targets against transformers: a tiny random Llama (tied embeddings, GQA,
//! rope_theta 50000 with llama3 scaling, MLP biases) and a tiny random Qwen2 (q/k/v biases)
//! from tests/reference/llama_reference.py; and a drafter trained here on the Llama, checked
//! against the config SpecForge derives for that target and loaded in z-lab's dflash.

use super::{load, max_diff, reference_dir, root};
use dflash_top::engine::checkpoint;
use dflash_top::engine::model::drafter::Drafter;
use dflash_top::engine::model::qwen3::{KvCache, Qwen3Target};
use dflash_top::engine::model::shapes::{Arch, Qwen3Config};
use dflash_top::engine::model::weights;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn::VarStore, Device, Tensor};

/// Decoder layers whose outputs llama_reference.py saved for the packed batch.
const CAPTURE: [i64; 3] = [0, 2, 4];

fn family_dir(name: &str) -> PathBuf {
    reference_dir().join(name)
}

/// The target of `dir` with `capture` (empty: every layer, for logits), its weights loaded;
/// every tensor of the file taken but the layers past the deepest captured one (a bias the
/// model lacked would be left over).
fn target(dir: &Path, capture: &[i64]) -> (VarStore, Qwen3Target) {
    let cfg = Qwen3Config::from_dir(dir).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let model = if capture.is_empty() {
        Qwen3Target::new_full(&vs.root(), &cfg, 0.02)
    } else {
        Qwen3Target::new(&vs.root(), &cfg, capture, 0.02)
    };
    let unused = weights::copy_into(&vs, &weights::WeightFiles::open(dir).unwrap(), dir).unwrap();
    let depth = capture
        .iter()
        .max()
        .map_or(cfg.num_hidden_layers, |d| d + 1);
    let left: Vec<_> = unused
        .iter()
        .filter(|n| {
            let layer = n
                .strip_prefix("model.layers.")
                .and_then(|r| r.split('.').next());
            layer
                .and_then(|l| l.parse::<i64>().ok())
                .is_none_or(|l| l < depth)
        })
        .collect();
    assert!(left.is_empty(), "tensors no variable took: {left:?}");
    (vs, model)
}

/// Hidden states of the captured layers on a packed batch (two rows of documents, positions
/// restarting in each), and the next-token logits after a prompt (all layers, the final norm,
/// the head tied to the embeddings), equal to transformers' within the Qwen3 test's tolerance.
fn matches_transformers(name: &str, arch: Arch) {
    let dir = family_dir(name);
    let r = load(&dir.join("reference.safetensors"));
    let tdir = dir.join("target");
    let cfg = Qwen3Config::from_dir(&tdir).unwrap();
    assert_eq!(cfg.model_type, arch);
    assert!(cfg.tie_word_embeddings && !cfg.qk_norm());
    let (_vs, mut model) = target(&tdir, &CAPTURE);
    // As loaded, then with q, k and v (and their biases) in one projection, as training runs it.
    for fused in [false, true] {
        if fused {
            model.fuse_projections();
        }
        let hidden = tch::no_grad(|| {
            model.forward(
                &r["packed.input_ids"],
                &r["packed.positions"],
                &r["packed.doc_ids"],
            )
        });
        let d = max_diff(&hidden, &r["packed.hidden"]);
        assert!(
            d < 1e-4,
            "{name} (fused: {fused}): hidden states differ by {d}"
        );
    }

    let (_vs, full) = target(&tdir, &[]);
    let logits = tch::no_grad(|| full.next_logits(&r["prompt"], &mut KvCache::default()));
    let d = max_diff(&logits, &r["logits"]);
    assert!(d < 1e-4, "{name}: next-token logits differ by {d}");
}

#[test]
fn llama_target_hidden_states_and_logits_match_transformers() {
    let cfg = Qwen3Config::from_dir(&family_dir("llama").join("target")).unwrap();
    let rope = cfg
        .rope_llama3
        .expect("the reference Llama scales its RoPE (llama3)");
    assert_eq!((cfg.rope_theta, rope.factor), (50000.0, 8.0));
    assert!(cfg.mlp_bias && !cfg.attention_bias);
    matches_transformers("llama", Arch::Llama);
}

#[test]
fn qwen2_target_hidden_states_and_logits_match_transformers() {
    let cfg = Qwen3Config::from_dir(&family_dir("qwen2").join("target")).unwrap();
    assert!(cfg.qkv_bias() && !cfg.o_bias() && cfg.rope_llama3.is_none());
    matches_transformers("qwen2", Arch::Qwen2);
}

/// A few training steps on the tiny Llama target, headless: every step's loss finite, and the
/// checkpoint is what SpecForge derives for that target (tests/reference/check_checkpoint.py
/// compares config.json field by field: Qwen3 layers of the Llama's width, its llama3 RoPE,
/// all full attention), loads in dflash without a missing key, and gives our drafter's output.
#[test]
fn a_drafter_trained_on_the_tiny_llama_is_specforges_and_loads_in_dflash() {
    let dir = family_dir("llama");
    let tmp = tempfile::tempdir().unwrap();
    let save = tmp.path().join("ckpt");
    let args = [
        "train",
        "--headless",
        "--steps",
        "4",
        "--interval",
        "0.2",
        "--seed",
        "1",
        "--drafter-layers",
        "2",
        "--block-size",
        "4",
        "--mask-token-id",
        "255",
        "--seq-len",
        "64",
        "--anchors",
        "4",
        "--batch",
        "1",
    ];
    let o = crate::support::bin()
        .args(args)
        .arg("--target")
        .arg(dir.join("target"))
        .arg("--save-dir")
        .arg(&save)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let config_line = out.lines().next().unwrap();
    assert!(config_line.contains("drafter_layers=2"), "{config_line}");
    let ckpt = dflash_top::save_layout::checkpoints_in(&save)
        .unwrap()
        .pop()
        .expect("a checkpoint at the end of the run");
    let state: checkpoint::TrainerState = serde_json::from_str(
        &std::fs::read_to_string(ckpt.join(checkpoint::TRAINER_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(state.step, 4);
    assert!(state.last_loss.is_some_and(f32::is_finite), "{state:?}");

    // Our drafter from the checkpoint, on the reference inputs.
    let spec = checkpoint::read_drafter_spec(&ckpt).unwrap();
    assert_eq!(spec.target_layer_ids, vec![1, 3]);
    assert_eq!(spec.layers.model_type, Arch::Qwen3);
    assert!(spec.layers.qk_norm() && spec.layers.rope_llama3.is_some());
    let vs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&vs.root(), &spec);
    checkpoint::load_weights(&ckpt, &vs).unwrap();
    let r: HashMap<String, Tensor> = load(&dir.join("reference.safetensors"));
    let (_tvs, target) = target(&dir.join("target"), &[1, 3]);
    let ours = tch::no_grad(|| {
        let emb = Tensor::embedding(&target.embed_tokens, &r["block_ids"], -1, false, false);
        drafter.forward(
            &r["target_hidden"],
            &r["positions"],
            &emb,
            &r["block_pos"],
            &r["mask"],
        )
    });

    let py_out = tmp.path().join("python_out.safetensors");
    let o = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("tests/reference/check_checkpoint.py"))
        .args([&ckpt, &dir, &py_out])
        .output()
        .expect("the venv's python runs (make test installs it)");
    assert!(
        o.status.success(),
        "the checkpoint is not as SpecForge derives it for a Llama target, or dflash could not \
         load it: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let d = max_diff(&ours, &load(&py_out)["drafter_out"]);
    assert!(d < 1e-4, "our drafter and dflash's differ by {d}");
}
