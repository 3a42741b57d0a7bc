//! The Rust engine against PyTorch + transformers + z-lab's dflash: the same weights, the same
//! inputs, the same numbers (tests/reference/make_reference.py makes them; `make test` runs it).

use dflash_top::engine::blocks::{block_mask, Anchors};
use dflash_top::engine::checkpoint::{self, TrainerState};
use dflash_top::engine::config::Qwen3Config;
use dflash_top::engine::drafter::Drafter;
use dflash_top::engine::optim::AdamW;
use dflash_top::engine::qwen3::Qwen3Target;
use dflash_top::engine::weights;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn::VarStore, Device, Kind, Tensor};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn reference_dir() -> PathBuf {
    let dir = root().join("target/reference");
    assert!(
        dir.join("reference.safetensors").is_file(),
        "{} is missing: `make test` (or `make reference`) writes it with PyTorch + transformers + dflash",
        dir.display()
    );
    dir
}

fn load(path: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    f64::try_from((a - b).abs().max()).unwrap()
}

struct Loaded {
    reference: HashMap<String, Tensor>,
    target: Qwen3Target,
    _target_vs: VarStore,
    drafter: Drafter,
    drafter_vs: VarStore,
}

fn load_models() -> Loaded {
    let dir = reference_dir();
    let reference = load(&dir.join("reference.safetensors"));
    let tdir = dir.join("target");
    let cfg = Qwen3Config::from_dir(&tdir).unwrap();
    let target_vs = VarStore::new(Device::Cpu);
    let target = Qwen3Target::new(&target_vs.root(), &cfg, &[1, 3], 0.02);
    weights::copy_into(&target_vs, &weights::read_all(&tdir).unwrap(), &tdir).unwrap();
    let ddir = dir.join("drafter");
    let spec = checkpoint::read_drafter_spec(&ddir).unwrap();
    let drafter_vs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&drafter_vs.root(), &spec);
    checkpoint::load_weights(&ddir, &drafter_vs).unwrap();
    Loaded {
        reference,
        target,
        _target_vs: target_vs,
        drafter,
        drafter_vs,
    }
}

fn drafter_out(m: &Loaded) -> Tensor {
    let r = &m.reference;
    let emb = Tensor::embedding(&m.target.embed_tokens, &r["block_ids"], -1, false, false);
    tch::no_grad(|| {
        m.drafter.forward(
            &r["target_hidden"],
            &r["positions"],
            &emb,
            &r["block_pos"],
            &r["mask"],
        )
    })
}

#[test]
fn target_hidden_states_match_transformers() {
    let m = load_models();
    let r = &m.reference;
    let docs = Tensor::zeros_like(&r["input_ids"]);
    let hidden = tch::no_grad(|| m.target.forward(&r["input_ids"], &r["positions"], &docs));
    let d = max_diff(&hidden, &r["target_hidden"]);
    assert!(d < 1e-4, "target hidden states differ by {d}");
}

#[test]
fn drafter_output_and_mask_match_dflash() {
    let m = load_models();
    let r = &m.reference;
    let spec = &m.drafter.spec;
    assert_eq!(spec.target_layer_ids, vec![1, 3]);
    assert_eq!(
        (spec.block_size, spec.mask_token_id, spec.num_target_layers),
        (4, 255, 6)
    );
    let d = max_diff(&drafter_out(&m), &r["drafter_out"]);
    assert!(d < 1e-4, "drafter outputs differ by {d}");
    // Our mask builder gives the same mask the reference used.
    let anchors = Anchors {
        pos: r["anchors"].shallow_clone(),
        valid: Tensor::ones_like(&r["anchors"]).to_kind(Kind::Bool),
        count: 3,
    };
    let docs = Tensor::zeros_like(&r["input_ids"]);
    assert!(block_mask(&docs, &anchors, 4).equal(&r["mask"]));
}

#[test]
fn a_checkpoint_saved_here_loads_in_dflash_with_the_same_outputs() {
    let m = load_models();
    let ours = drafter_out(&m);
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("step-000001");
    let opt = AdamW::new(m.drafter_vs.variables().into_iter().collect());
    let state = TrainerState {
        step: 1,
        total_steps: 10,
        seed: 0,
        lr: 1e-3,
        ..TrainerState::default()
    };
    checkpoint::save(&ckpt, &m.drafter.spec, &m.drafter_vs, &opt, &state).unwrap();
    let out = tmp.path().join("python_out.safetensors");
    let status = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("tests/reference/check_checkpoint.py"))
        .args([&ckpt, &reference_dir(), &out])
        .status()
        .expect("the venv's python runs (make test installs it)");
    assert!(
        status.success(),
        "dflash could not load the checkpoint cleanly"
    );
    let theirs = load(&out);
    let d = max_diff(&ours, &theirs["drafter_out"]);
    assert!(d < 1e-4, "outputs after the round trip differ by {d}");
}

/// The Python peer of the speed table (python/peer/dflash_peer.py: transformers' Qwen3 target,
/// z-lab's DFlashDraftModel, a thread and a queue) runs end to end on the CPU at the tiny shapes,
/// and its loss starts where an untrained drafter's must: near ln(vocab), every step finite.
#[test]
fn python_peer_trains_the_tiny_preset_on_the_cpu() {
    let out = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("python/peer/dflash_peer.py"))
        .args([
            "--preset", "tiny", "--device", "cpu", "--steps", "2", "--warmup", "1",
        ])
        .args(["--seq", "128", "--batch", "1", "--anchors", "8"])
        .output()
        .expect("the venv's python runs (make test installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the peer failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(line["finite"], true, "{line}");
    assert!(line["tok_per_s"].as_f64().unwrap() > 0.0, "{line}");
    let first = line["loss_first"].as_f64().unwrap();
    let chance = (512f64).ln();
    assert!(
        (first - chance).abs() < 0.15 * chance,
        "an untrained drafter's loss is near ln(512) = {chance:.2}, got {first}"
    );
}
