//! The Rust engine against PyTorch + transformers + z-lab's dflash: the same weights, the same
//! inputs, the same numbers (tests/reference/make_reference.py makes them; `make test` runs it).

use dflash_top::engine::checkpoint::{self, TrainerState};
use dflash_top::engine::model::drafter::Drafter;
use dflash_top::engine::model::qwen3::Qwen3Target;
use dflash_top::engine::model::shapes::Qwen3Config;
use dflash_top::engine::model::weights;
use dflash_top::engine::train::blocks::{block_mask, Anchors};
use dflash_top::engine::train::optim::AdamW;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn::VarStore, Device, Kind, Tensor};

mod llama;

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
    weights::copy_into(
        &target_vs,
        &weights::WeightFiles::open(&tdir).unwrap(),
        &tdir,
    )
    .unwrap();
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

/// A checkpoint is what SpecForge exports, field for field, with bf16 weights
/// (tests/reference/check_checkpoint.py checks that), and it loads in dflash with the outputs of
/// our drafter on bf16-rounded weights.
#[test]
fn a_checkpoint_saved_here_loads_in_dflash_with_the_same_outputs() {
    let m = load_models();
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
    // The master weights stay fp32 in the optimizer file.
    let saved = load(&ckpt.join(checkpoint::OPTIMIZER_FILE));
    let vars = m.drafter_vs.variables();
    assert!(!vars.is_empty());
    for (name, v) in &vars {
        let master = &saved[&format!("master.{name}")];
        assert_eq!(master.kind(), Kind::Float, "{name}");
        assert!(master.equal(v), "master.{name} is the fp32 weight");
    }
    tch::no_grad(|| {
        for (_, mut v) in vars {
            let rounded = v.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            v.copy_(&rounded);
        }
    });
    let ours = drafter_out(&m);
    let out = tmp.path().join("python_out.safetensors");
    let o = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("tests/reference/check_checkpoint.py"))
        .args([&ckpt, &reference_dir(), &out])
        .output()
        .expect("the venv's python runs (make test installs it)");
    assert!(
        o.status.success(),
        "the checkpoint is not as SpecForge exports it, or dflash could not load it: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let theirs = load(&out);
    let d = max_diff(&ours, &theirs["drafter_out"]);
    assert!(d < 1e-4, "outputs after the round trip differ by {d}");
}

/// The Python peer of the speed table (python/peer/dflash_peer.py: transformers' Qwen3 target,
/// z-lab's DFlashDraftModel, a thread and a queue) runs end to end on the CPU at the tiny shapes,
/// and it learns: every step finite, the loss of its last steps well below its first ones'.
#[test]
fn python_peer_trains_the_tiny_preset_on_the_cpu() {
    let out = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("python/peer/dflash_peer.py"))
        .args([
            "--preset", "tiny", "--device", "cpu", "--steps", "20", "--warmup", "1",
        ])
        .args([
            "--seq",
            "128",
            "--batch",
            "1",
            "--anchors",
            "8",
            "--lr",
            "3e-3",
        ])
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
    let losses: Vec<f64> = serde_json::from_value(line["losses"].clone()).unwrap();
    assert_eq!(losses.len(), 21, "{line}");
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&losses[..5]), mean(&losses[16..]));
    assert!(
        last < 0.8 * first,
        "the peer's loss falls: first steps {first:.2}, last {last:.2} ({losses:?})"
    );
}

/// SpecForge's throughput peer (python/peer/sf_peer.py: its drafter, loss, BF16Optimizer and
/// train step behind the same target thread) runs end to end on the CPU at the tiny shapes, and
/// learns: every step finite, its last losses well below its first.
#[test]
fn specforge_peer_trains_the_tiny_preset_on_the_cpu() {
    let out = std::process::Command::new(root().join(".venv/bin/python"))
        .arg(root().join("python/peer/sf_peer.py"))
        .args([
            "--preset", "tiny", "--device", "cpu", "--steps", "12", "--warmup", "1",
        ])
        .args([
            "--seq",
            "128",
            "--anchors",
            "8",
            "--drafter-layers",
            "2",
            "--lr",
            "3e-3",
        ])
        .output()
        .expect("the venv's python runs (make test installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SpecForge peer failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(line["finite"], true, "{line}");
    assert_eq!(line["stack"], "specforge", "{line}");
    let losses: Vec<f64> = serde_json::from_value(line["losses"].clone()).unwrap();
    assert_eq!(losses.len(), 13, "{line}");
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&losses[..3]), mean(&losses[10..]));
    assert!(
        last < 0.8 * first,
        "SpecForge's loss falls: first steps {first:.2}, last {last:.2} ({losses:?})"
    );
}

/// One training step's loss, labels and drafter gradients against a Python computation that
/// follows SpecForge's DFlash mask and loss (built there from document ids, anchors and the
/// block, not from ours), on two rows of two documents and padding each.
#[test]
fn training_loss_labels_and_gradients_match_specforges_rules_on_packed_rows() {
    use dflash_top::engine::model::tiled::AttnMask;
    use dflash_top::engine::train::blocks::{
        block_input_ids, block_labels, block_positions, tiled_block_mask,
    };
    use dflash_top::engine::train::loss::{chunked_loss_backward, gamma_for, slot_weights};
    let m = load_models();
    let r = &m.reference;
    let t = |k: &str| r[&format!("train.{k}")].shallow_clone();
    let (ids, docs, pos, lmask) = (t("input_ids"), t("doc_ids"), t("positions"), t("loss_mask"));
    let block = m.drafter.spec.block_size;

    // The target over packed rows equals the target run on each document alone.
    let hidden = tch::no_grad(|| m.target.forward(&ids, &pos, &docs));
    let d = max_diff(&hidden, &t("target_hidden"));
    assert!(d < 1e-4, "packed target hidden states differ by {d}");

    let anchors = Anchors {
        pos: t("anchors"),
        valid: t("anchor_valid"),
        count: 7,
    };
    assert!(
        block_mask(&docs, &anchors, block).equal(&t("mask")),
        "block mask"
    );
    let host_docs = Vec::<i64>::try_from(docs.flatten(0, -1)).unwrap();
    let per_row = crate::attention::host_rows(&anchors);
    let tiled = AttnMask::Tiled(tiled_block_mask(
        &docs, &anchors, block, &per_row, &host_docs,
    ));
    assert!(tiled.dense().equal(&t("mask")), "tiled block mask");

    let (labels, valid) = block_labels(&ids, &docs, &lmask, &anchors, block);
    let weight = t("weight");
    assert!(valid.equal(&weight.gt(0.0)), "which labels carry loss");
    let counted = |x: &Tensor| x.masked_select(&valid);
    assert!(counted(&labels).equal(&counted(&t("labels"))), "labels");

    // Forward, the chunked loss (3 rows a chunk: several chunks) and the backward, as the
    // drafter worker runs them, from zero gradients.
    m.drafter_vs.variables().values().for_each(|v| {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    });
    let block_ids = block_input_ids(&ids, &anchors, block, m.drafter.spec.mask_token_id);
    let block_pos = block_positions(&pos, &anchors, block);
    let emb = Tensor::embedding(&m.target.embed_tokens, &block_ids, -1, false, false).detach();
    let out = m
        .drafter
        .forward_masked(&hidden, &pos, &emb, &block_pos, &tiled);
    let weights = slot_weights(block, gamma_for(block));
    let (loss, backward) =
        chunked_loss_backward(&out, &m.target.lm_head, &labels, &valid, &weights, 3);
    backward();
    let ours = f64::try_from(&loss.loss).unwrap();
    let theirs = f64::try_from(&t("loss").squeeze()).unwrap();
    assert!((ours - theirs).abs() < 1e-4, "loss {ours} vs {theirs}");
    let mut checked = 0;
    for (name, var) in m.drafter_vs.variables() {
        let theirs = &r[&format!("grad.{name}")];
        let g = var.grad();
        let scale = f64::try_from(theirs.abs().max()).unwrap().max(1e-6);
        let d = max_diff(&g, theirs) / scale;
        assert!(
            d < 1e-3,
            "gradient of {name} differs by {d} (relative to its largest)"
        );
        checked += 1;
    }
    assert_eq!(checked, r.keys().filter(|k| k.starts_with("grad.")).count());
}

/// A drafter with a sliding-attention layer, trained-style (all blocks at once under the block
/// mask) here, gives what dflash computes when it decodes each block (its own causal, windowed
/// mask for that layer, none for the full one).
#[test]
fn sliding_window_layers_match_dflash_decoding() {
    let m = load_models();
    let r = &m.reference;
    let dir = reference_dir().join("drafter_sliding");
    let spec = checkpoint::read_drafter_spec(&dir).unwrap();
    assert_eq!(spec.layers.window_of(0), Some(3));
    assert_eq!(spec.layers.window_of(1), None);
    let vs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&vs.root(), &spec);
    checkpoint::load_weights(&dir, &vs).unwrap();
    let emb = Tensor::embedding(&m.target.embed_tokens, &r["block_ids"], -1, false, false);
    let ours = tch::no_grad(|| {
        drafter.forward(
            &r["target_hidden"],
            &r["positions"],
            &emb,
            &r["block_pos"],
            &r["mask"],
        )
    });
    let d = max_diff(&ours, &r["sliding_out"]);
    assert!(d < 1e-4, "sliding-window drafter outputs differ by {d}");
    // The window matters here: the full-attention drafter gives something else.
    assert!(max_diff(&drafter_out(&m), &r["sliding_out"]) > 1e-2);
    // Saved here, the config keeps the layer types and the window dflash reads.
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("step-000001");
    let opt = AdamW::new(vs.variables().into_iter().collect());
    checkpoint::save(&ckpt, &spec, &vs, &opt, &TrainerState::default()).unwrap();
    assert_eq!(checkpoint::read_drafter_spec(&ckpt).unwrap(), spec);
}

/// dflash config settings this trainer does not apply are refused by name; neutral values load.
#[test]
fn dflash_config_extras_are_refused_by_name_unless_neutral() {
    let src = reference_dir().join("drafter/config.json");
    let base: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    type Edit = dyn Fn(&mut serde_json::Value);
    let with = |edit: &Edit| {
        let mut cfg = base.clone();
        edit(&mut cfg);
        std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
        checkpoint::read_drafter_spec(tmp.path()).map_err(|e| format!("{e:#}"))
    };
    use serde_json::json;
    with(&|c| {
        c["dflash_config"]["input_embedding_scale"] = json!(1.0);
        c["output_multiplier"] = json!(1.0);
        c["final_logit_softcapping"] = json!(null);
    })
    .unwrap();
    let refused: [(&str, &Edit); 5] = [
        ("input_embedding_scale", &|c| {
            c["dflash_config"]["input_embedding_scale"] = json!(2.0)
        }),
        ("output_multiplier", &|c| {
            c["output_multiplier"] = json!(0.5)
        }),
        ("final_logit_softcapping", &|c| {
            c["dflash_config"]["final_logit_softcapping"] = json!(30.0)
        }),
        ("DFlash2", &|c| {
            c["architectures"] = json!(["DFlash2DraftModel"])
        }),
        ("is_causal", &|c| c["is_causal"] = json!(true)),
    ];
    for (key, edit) in refused {
        let e = with(edit).unwrap_err();
        assert!(e.contains(key) && e.contains("config.json"), "{key}: {e}");
    }
}
