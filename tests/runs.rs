//! The real binary: headless training whose loss falls, checkpoints and resume, and bad inputs
//! that end in one sentence naming the file or flag, a non-zero exit and no panic.

use std::path::Path;
use std::process::Output;

use super::support::{field, run, stderr, train};

/// Fails with the message when the run did not end in a clear user error.
pub fn assert_user_error(o: &Output, must_mention: &[&str]) {
    let err = stderr(o);
    assert!(!o.status.success(), "expected failure, got success: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "a panic, not a sentence: {err}"
    );
    assert!(err.starts_with("dflash-top: "), "{err}");
    for m in must_mention {
        assert!(err.contains(m), "error should mention `{m}`: {err}");
    }
}

#[test]
fn headless_run_prints_interval_lines_and_its_loss_falls() {
    let o = train(&["--steps", "160", "--interval", "0.5", "--seed", "3"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("t=")).collect();
    assert!(lines.len() >= 2, "{out}");
    for key in [
        "step=",
        "loss=",
        "tau=",
        "tok/s=",
        "forward_ms=",
        "q.hs=",
        "q.batch=",
        "verdict=",
    ] {
        assert!(
            lines.last().unwrap().contains(key),
            "no {key} in {}",
            lines.last().unwrap()
        );
    }
    // Issue 28: the drafter reads the device back once a step, in metrics; nothing else does.
    let counted: Vec<f64> = lines
        .iter()
        .filter_map(|l| {
            let drafter = l.split(" | ").find(|p| p.starts_with("drafter-0 "))?;
            field(drafter, "metrics_syncs")
        })
        .collect();
    assert!(
        !counted.is_empty() && counted.iter().all(|n| *n == 1.0),
        "{out}"
    );
    let syncs = |l: &&str| l.matches("_syncs=").count();
    assert!(lines.iter().all(|l| syncs(l) <= 1), "{out}");
    // Issue 28: on the CPU no thread's CUDA calls are counted; the config line says why.
    for part in lines.last().unwrap().split(" | ").skip(1).take(3) {
        assert!(part.ends_with(" launches=n/a"), "{part}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("config: ") && l.contains(" cupti=n/a (no CUDA device in use) ")),
        "{out}"
    );
    let first = lines
        .iter()
        .find_map(|l| field(l, "loss"))
        .expect("a loss in the interval lines");
    let summary = out
        .lines()
        .find(|l| l.starts_with("summary:"))
        .expect("summary line");
    assert_eq!(field(summary, "steps"), Some(160.0));
    let last = field(summary, "loss").unwrap();
    assert!(
        last < 0.8 * first,
        "loss did not fall: first {first}, last {last}"
    );
}

#[test]
fn checkpoints_are_complete_and_resume_continues_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let save = dir.path().to_str().unwrap();
    let o = train(&["--steps", "6", "--save-dir", save, "--save-every", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for step in ["step-000003", "step-000006"] {
        let ck = dir.path().join(step);
        for f in [
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer_state.json",
        ] {
            assert!(ck.join(f).is_file(), "{step}/{f} missing");
        }
    }
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("step-000006/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cfg["dflash_config"]["block_size"], 16);
    assert_eq!(
        cfg["dflash_config"]["target_layer_ids"],
        serde_json::json!([1, 3])
    );
    // No temporary directory left behind.
    assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with('.')));

    // A cosine run ends at its --steps: resuming past it is refused, not trained at lr 0.
    let resume = dir.path().join("step-000006");
    let o = train(&["--steps", "9", "--resume", resume.to_str().unwrap()]);
    assert_user_error(&o, &["--steps 9", "trainer_state.json", "cosine over 6"]);
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn tensors(path: &Path) -> std::collections::HashMap<String, tch::Tensor> {
    tch::Tensor::read_safetensors(path)
        .unwrap()
        .into_iter()
        .collect()
}

/// Every tensor of `a` equals `b`'s to float tolerance.
fn assert_same_tensors(a: &Path, b: &Path) {
    let (a_t, b_t) = (tensors(a), tensors(b));
    assert_eq!(a_t.len(), b_t.len(), "{}", a.display());
    for (name, t) in &a_t {
        let u = &b_t[name];
        let diff = f64::try_from(
            (t.to_kind(tch::Kind::Double) - u.to_kind(tch::Kind::Double))
                .abs()
                .max(),
        )
        .unwrap();
        assert!(
            diff <= 1e-6,
            "{name} in {}: differs by {diff}",
            a.file_name().unwrap().to_string_lossy()
        );
    }
}

#[test]
fn n_steps_then_resume_and_n_more_equal_2n_steps_in_one_go() {
    resume_equals_one_go(&[]);
}

/// The same on a JSONL file of a few documents: several shuffled epochs, resumed mid-epoch.
#[test]
fn a_resumed_jsonl_run_continues_its_shuffled_epochs_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("docs.jsonl");
    let lines: Vec<String> = (0..5)
        .map(|d| {
            let ids: Vec<i64> = (0..60 + 20 * d).map(|i| (i * (d + 3) + d) % 500).collect();
            serde_json::json!({ "input_ids": ids }).to_string()
        })
        .collect();
    std::fs::write(&data, lines.join("\n")).unwrap();
    resume_equals_one_go(&["--data", data.to_str().unwrap()]);
}

/// A run of 3 optimizer steps a row, resumed at a row's end without the flag: it keeps its steps
/// a row from the checkpoint (the default would split the next row otherwise) and goes on as in
/// one go.
#[test]
fn a_resumed_run_keeps_its_steps_a_row() {
    let dir = resume_equals_one_go_with(&[], &["--steps-per-batch", "3"], 3);
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let state = json(&one.join("step-000003").join("trainer_state.json"));
    assert_eq!(state["steps_per_batch"], 3, "{state}");
    assert!(state.get("batch_steps_done").is_none(), "{state}");
    assert_eq!(
        json(&two.join("step-000006").join("trainer_state.json"))["steps_per_batch"],
        3
    );
}

/// A run with its AdamW moments in bf16 (`--optimizer-states bf16`), resumed without the flag:
/// it keeps bf16 moments from the checkpoint (f32 ones would step apart from one go) and goes on
/// as in one go; the optimizer file holds the moments in bf16, the masters in f32.
#[test]
fn a_run_with_bf16_moments_resumes_with_them() {
    let dir = resume_equals_one_go_with(&[], &["--optimizer-states", "bf16"], 3);
    for run in ["one", "two"] {
        let last = dir.path().join(run).join("step-000006");
        let state = json(&last.join("trainer_state.json"));
        assert_eq!(state["optimizer_states"], "bf16", "{run}: {state}");
        let saved = tensors(&last.join("optimizer.safetensors"));
        let kinds = |prefix: &str| {
            let mut k: Vec<_> = saved
                .iter()
                .filter(|(n, _)| n.starts_with(prefix))
                .map(|(_, t)| t.kind())
                .collect();
            k.dedup();
            k
        };
        assert_eq!(kinds("exp_avg_sq."), [tch::Kind::BFloat16], "{run}");
        assert_eq!(kinds("exp_avg."), [tch::Kind::BFloat16], "{run}");
        assert_eq!(kinds("master."), [tch::Kind::Float], "{run}");
    }
    let o = train(&["--steps", "1", "--optimizer-states", "int8"]);
    assert_user_error(&o, &["--optimizer-states", "`int8`", "f32 or bf16"]);
}

/// Saved after the first of a row's 3 steps, a run resumes into that row: it takes the same row
/// again, draws the same anchors and trains the row's last two steps, as in one go.
#[test]
fn a_run_saved_partway_through_a_row_resumes_at_its_next_step() {
    let dir = resume_equals_one_go_with(&["--steps-per-batch", "3"], &[], 4);
    let state = json(&dir.path().join("one/step-000004/trainer_state.json"));
    assert_eq!(state["batch_steps_done"], 1, "{state}");
    let row_end = json(&dir.path().join("one/step-000003/trainer_state.json"));
    for key in ["data_docs", "anchor_rng"] {
        assert_eq!(state[key], row_end[key], "{key}: as before the row");
    }
    // Resumed with other steps a row, the row would be cut otherwise: refused, by name.
    let from = dir.path().join("one/step-000004");
    let o = run(&[
        "train",
        "--headless",
        "--steps",
        "6",
        "--steps-per-batch",
        "2",
        "--resume",
        from.to_str().unwrap(),
    ]);
    assert_user_error(
        &o,
        &[
            "--steps-per-batch 2",
            "after 1 of a batch's steps, with --steps-per-batch 3",
        ],
    );
}

/// A step a document (`--steps-per-batch doc`): the first batch of the tiny preset's data holds
/// 4 documents, 4 steps; saved after the second, the run resumes at the third, as in one go.
#[test]
fn a_step_a_document_resumes_partway_through_a_batch_as_in_one_go() {
    let dir = resume_equals_one_go_with(&["--steps-per-batch", "doc"], &[], 2);
    let state = json(&dir.path().join("one/step-000002/trainer_state.json"));
    assert_eq!(state["steps_per_batch"], -1, "doc, as kept: {state}");
    assert_eq!(state["batch_steps_done"], 2, "{state}");
    assert_eq!(state["data_docs"], 0, "as before the first batch: {state}");
    let next_batch = json(&dir.path().join("one/step-000005/trainer_state.json"));
    assert!(next_batch["data_docs"].as_u64() > Some(0), "{next_batch}");
}

fn resume_equals_one_go(extra: &[&str]) {
    resume_equals_one_go_with(extra, &[], 3);
}

/// Trains 6 steps in one go (with `extra`, and `first`) saving each, then resumes its step
/// `from` (with `extra` only) to 6: the losses, trainer states, weights and AdamW moments agree.
/// The folder of both runs' saves (`one`, `two`) comes back.
fn resume_equals_one_go_with(extra: &[&str], first: &[&str], from: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let mut common = vec!["--headless", "--save-every", "1", "--interval", "30"];
    common.extend(extra);
    let mut args = vec!["train", "--steps", "6", "--save-dir", one.to_str().unwrap()];
    args.extend(["--seed", "4"]);
    args.extend(&common);
    args.extend(first);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let from_dir = one.join(format!("step-{from:06}"));
    // Another seed would be another run: refused, by name.
    let mut args = vec!["train", "--steps", "6", "--save-dir", two.to_str().unwrap()];
    args.extend(["--resume", from_dir.to_str().unwrap(), "--seed", "5"]);
    args.extend(&common);
    assert_user_error(&run(&args), &["`seed` 5", "trainer_state.json", "seed 4"]);
    // The seed comes back from the checkpoint: not given again here.
    let mut args = vec!["train", "--steps", "6", "--save-dir", two.to_str().unwrap()];
    args.extend(["--resume", from_dir.to_str().unwrap()]);
    args.extend(&common);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert_eq!(field(summary, "from_step"), Some(from as f64), "{summary}");
    assert_eq!(
        field(summary, "steps"),
        Some(6.0 - from as f64),
        "{summary}"
    );
    for step in from + 1..=6 {
        let ck = format!("step-{step:06}");
        let (a, b) = (one.join(&ck), two.join(&ck));
        let (sa, sb) = (
            json(&a.join("trainer_state.json")),
            json(&b.join("trainer_state.json")),
        );
        let (la, lb) = (
            sa["last_loss"].as_f64().unwrap(),
            sb["last_loss"].as_f64().unwrap(),
        );
        assert!(
            (la - lb).abs() <= 1e-5 * la.abs().max(1.0),
            "step {step}: loss {la} in one go, {lb} resumed"
        );
        for key in ["data_docs", "anchor_rng", "schedule", "lr", "step", "seed"] {
            assert_eq!(sa[key], sb[key], "step {step}: {key}");
        }
    }
    // The weights and the AdamW moments at the end, not only the losses.
    let last = "step-000006";
    assert_same_tensors(
        &one.join(last).join("model.safetensors"),
        &two.join(last).join("model.safetensors"),
    );
    assert_same_tensors(
        &one.join(last).join("optimizer.safetensors"),
        &two.join(last).join("optimizer.safetensors"),
    );
    dir
}

pub fn write_tiny_target(dir: &Path, config_edit: impl FnOnce(&mut serde_json::Value)) {
    use dflash_top::engine::model::qwen3::Qwen3Target;
    use dflash_top::engine::train::presets::Preset;
    let p = Preset::by_name("tiny").unwrap();
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _t = Qwen3Target::new(&vs.root(), &p.target, &[5], 0.02);
    vs.save(dir.join("model.safetensors")).unwrap();
    let mut cfg = serde_json::to_value(&p.target).unwrap();
    config_edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

/// CPU-sized overrides of SpecForge's recipe for a tiny --target.
const SMALL: [&str; 8] = [
    "--seq-len",
    "128",
    "--anchors",
    "4",
    "--drafter-layers",
    "2",
    "--batch",
    "1",
];

#[test]
fn a_target_directory_loads_and_trains_with_its_recipe() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_target(dir.path(), |_| {});
    // No tokenizer: no mask token to find, and the sentence says how to give one.
    let target = dir.path().to_str().unwrap();
    let o = train(&["--steps", "2", "--target", target]);
    assert_user_error(&o, &["tokenizer_config.json", "--mask-token-id"]);
    // With the target's tokenizer (11 ids): the mask token is the first id it leaves unused.
    crate::engine::word_tokenizer(dir.path());
    let mut args = vec!["train", "--headless", "--steps", "2", "--target", target];
    args.extend(SMALL);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().next().unwrap();
    assert!(line.starts_with("config: recipe=target "), "{line}");
    for kv in [
        "lr=6e-4",
        "block=16",
        "mask_token_id=11",
        "seq_len=128",
        "anchors=4 anchor_budget=per-doc",
        "steps_per_batch=doc",
        "drafter_layers=2",
    ] {
        assert!(line.contains(kv), "no {kv} in {line}");
    }
    // Its checkpoint trains a step a document: resumed with two drafters, which cannot, the
    // sentence names the checkpoint, not a flag the user never gave, and the fix.
    let saves = dir.path().join("saves");
    let mut saving = args.clone();
    saving.extend(["--save-dir", saves.to_str().unwrap()]);
    let o = run(&saving);
    assert!(o.status.success(), "{}", stderr(&o));
    let step = saves.join("step-000002");
    let o = run(&[
        "train",
        "--headless",
        "--steps",
        "4",
        "--target",
        target,
        "--resume",
        step.to_str().unwrap(),
        "--drafter-devices",
        "cpu,cpu",
    ]);
    assert_user_error(
        &o,
        &[
            "the checkpoint",
            "step-000002",
            "a step a document",
            "--steps-per-batch 6",
        ],
    );
    // Chat data with a tokenizer that has no chat template: refused at start, by name.
    let chat = dir.path().join("chat.jsonl");
    std::fs::write(
        &chat,
        r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}"#,
    )
    .unwrap();
    args.extend(["--data", chat.to_str().unwrap()]);
    let o = run(&args);
    assert_user_error(
        &o,
        &[
            "chat.jsonl line 1",
            "chat template",
            "tokenizer_config.json",
            "input_ids",
        ],
    );
}

/// A malformed line far into a JSONL file does not stop the start (the file streams): the loader
/// meets it while the run goes, and the run ends with a sentence naming the file and line.
#[test]
fn a_bad_line_far_into_a_jsonl_file_stops_the_run_when_reached() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("late.jsonl");
    let mut lines: Vec<String> = (0..40i64)
        .map(|d| {
            let ids: Vec<i64> = (0..40).map(|i| (i * 7 + d) % 500).collect();
            serde_json::json!({ "input_ids": ids }).to_string()
        })
        .collect();
    lines.push(r#"{"input_ids": [1, 2"#.into());
    std::fs::write(&data, lines.join("\n")).unwrap();
    let o = train(&["--data", data.to_str().unwrap()]);
    assert_user_error(
        &o,
        &["loader failed", "late.jsonl line 41", "not valid JSON"],
    );
}

#[test]
fn bad_inputs_end_in_a_sentence_not_a_panic() {
    let unknown = train(&["--preset", "qwen9"]);
    assert_user_error(&unknown, &["--preset", "tiny"]);

    let no_device = train(&["--target-devices", "cuda:3"]);
    assert_user_error(&no_device, &["--target-devices", "cuda:3"]);

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    let o = train(&["--data", empty.to_str().unwrap()]);
    assert_user_error(&o, &["empty.jsonl", "no document"]);

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(
        &bad,
        "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, \"x\"]}\n",
    )
    .unwrap();
    let o = train(&["--data", bad.to_str().unwrap()]);
    assert_user_error(&o, &["bad.jsonl line 2", "input_ids"]);

    let missing_field = tempfile::tempdir().unwrap();
    write_tiny_target(missing_field.path(), |c| {
        c.as_object_mut().unwrap().remove("intermediate_size");
    });
    let o = train(&[
        "--mask-token-id",
        "511",
        "--target",
        missing_field.path().to_str().unwrap(),
    ]);
    assert_user_error(&o, &["config.json", "intermediate_size"]);

    let wrong_shape = tempfile::tempdir().unwrap();
    write_tiny_target(wrong_shape.path(), |c| {
        c["intermediate_size"] = serde_json::json!(256)
    });
    let o = train(&[
        "--mask-token-id",
        "511",
        "--target",
        wrong_shape.path().to_str().unwrap(),
    ]);
    assert_user_error(&o, &["model.safetensors", "has shape"]);

    let truncated = tempfile::tempdir().unwrap();
    write_tiny_target(truncated.path(), |_| {});
    let f = truncated.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    let o = train(&[
        "--mask-token-id",
        "511",
        "--target",
        truncated.path().to_str().unwrap(),
    ]);
    assert_user_error(&o, &["model.safetensors", "truncated"]);

    let bad_toml = dir.path().join("run.toml");
    std::fs::write(&bad_toml, "sequence_length = 5\n").unwrap();
    let o = train(&["--config", bad_toml.to_str().unwrap()]);
    assert_user_error(&o, &["run.toml", "sequence_length"]);

    let o = train(&["--resume", "/nonexistent/ckpt"]);
    assert_user_error(&o, &["--resume", "/nonexistent/ckpt"]);

    let o = train(&["--slow", "gpu=5ms"]);
    assert_user_error(&o, &["--slow", "gpu"]);
}

#[test]
fn the_tui_refuses_a_non_terminal_with_a_sentence() {
    let o = run(&["train", "--steps", "1"]);
    assert_user_error(&o, &["not a terminal", "--headless"]);
}

#[test]
fn a_sharded_target_loads_through_its_index() {
    use dflash_top::engine::model::qwen3::Qwen3Target;
    use dflash_top::engine::train::presets::Preset;
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let _t = Qwen3Target::new(&vs.root(), &p.target, &[5], 0.02);
    let mut names: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let half = names.len() / 2;
    let mut map = serde_json::Map::new();
    for (i, part) in [&names[..half], &names[half..]].iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        tch::Tensor::write_safetensors(part, dir.path().join(&file)).unwrap();
        for (n, _) in part.iter() {
            map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        serde_json::to_string(&p.target).unwrap(),
    )
    .unwrap();
    let mut args = vec![
        "train",
        "--headless",
        "--steps",
        "2",
        "--mask-token-id",
        "511",
        "--target",
        dir.path().to_str().unwrap(),
    ];
    args.extend(SMALL);
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    // A shard named in the index but missing: named in the error.
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let mut args = vec![
        "train",
        "--headless",
        "--steps",
        "2",
        "--mask-token-id",
        "511",
        "--target",
        dir.path().to_str().unwrap(),
    ];
    args.extend(SMALL);
    let o = run(&args);
    assert_user_error(&o, &["model-00002-of-00002.safetensors", "missing"]);
}

#[test]
fn training_starts_from_a_saved_drafter_and_refuses_a_mismatched_one() {
    let dir = tempfile::tempdir().unwrap();
    let (save, again) = (dir.path().join("runs"), dir.path().join("again"));
    // 30 steps from a fresh drafter; step-000001 holds the fresh drafter's first loss.
    let o = train(&[
        "--steps",
        "30",
        "--save-every",
        "1",
        "--save-dir",
        save.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = save.join("step-000030");
    // The same first batch (same seed, data from the start), from the trained weights, with an
    // lr so small that the step leaves them as they were.
    let o = train(&[
        "--steps",
        "1",
        "--lr",
        "1e-12",
        "--drafter",
        ckpt.to_str().unwrap(),
        "--save-dir",
        again.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("from_step=0"),
        "--drafter starts a new run from those weights: {out}"
    );
    let first = again.join("step-000001");
    assert_same_tensors(
        &first.join("model.safetensors"),
        &ckpt.join("model.safetensors"),
    );
    let loss = |d: &Path| {
        json(&d.join("trainer_state.json"))["last_loss"]
            .as_f64()
            .unwrap()
    };
    let (fresh, trained) = (loss(&save.join("step-000001")), loss(&first));
    assert!(
        trained < 0.8 * fresh,
        "the first loss from the saved drafter ({trained}) is no lower than a fresh one's ({fresh})"
    );

    let cfg_path = ckpt.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["hidden_size"] = serde_json::json!(64);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    // An edited file no longer matches its checksum: refused, with the way out for an edit
    // made on purpose; without the checksums the mismatch itself is named.
    let o = train(&["--drafter", ckpt.to_str().unwrap()]);
    assert_user_error(&o, &["config.json", "checksum", "delete"]);
    std::fs::remove_file(ckpt.join("checksums.json")).unwrap();
    let o = train(&["--drafter", ckpt.to_str().unwrap()]);
    assert_user_error(&o, &["hidden_size", "64", "128"]);
}

#[test]
fn two_cpu_drafter_replicas_train_in_step() {
    let o = train(&[
        "--drafter-devices",
        "cpu,cpu",
        "--steps",
        "4",
        "--interval",
        "0.2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert_eq!(
        field(summary, "step"),
        Some(4.0),
        "replicas step together: {summary}"
    );
    let line = out.lines().rfind(|l| l.starts_with("t=")).unwrap();
    assert!(
        line.contains("drafter-0") && line.contains("drafter-1"),
        "{line}"
    );
    assert!(line.contains("grad_sync_ms="), "{line}");
}

/// `bench drafter` times the drafter alone: every phase of its step, the step the sum of them.
#[test]
fn bench_drafter_times_each_phase_of_the_drafter_alone() {
    let o = run(&["bench", "drafter", "--steps", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let head = out
        .lines()
        .find(|l| l.starts_with("bench: drafter alone"))
        .unwrap();
    let phases = out
        .lines()
        .find(|l| l.starts_with("bench: drafter ms a step:"))
        .unwrap();
    let names: Vec<&str> = phases
        .split_whitespace()
        .filter_map(|w| w.split_once('=').map(|(k, _)| k))
        .collect();
    assert_eq!(
        names,
        ["forward", "loss", "backward", "clip", "optim", "metrics"],
        "{phases}"
    );
    let sum: f64 = names.iter().map(|n| field(phases, n).unwrap()).sum();
    let step = field(head, "step_ms").unwrap();
    assert!(
        names.iter().all(|n| field(phases, n).unwrap() > 0.0),
        "{phases}"
    );
    // Each figure is printed to 0.1 ms: the sum can part from the step by half of that for
    // each of the phases and for the step.
    let rounding = 0.05 * (names.len() + 1) as f64 + 1e-9;
    assert!(
        (sum - step).abs() <= rounding,
        "the phases add up to the step: {sum} vs {step}"
    );
}

#[test]
fn cpu_replicas_end_identical_and_learn_like_one_drafter_with_all_their_rows() {
    let o = run(&[
        "bench",
        "replicas",
        "--drafter-devices",
        "cpu,cpu",
        "--steps",
        "5",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("replicas identical after 5 steps: yes"),
        "{out}"
    );
    let losses: Vec<(f64, f64)> = out
        .lines()
        .filter(|l| l.starts_with("bench: step "))
        .map(|l| (field(l, "replicas").unwrap(), field(l, "single").unwrap()))
        .collect();
    assert_eq!(losses.len(), 5, "{out}");
    for (r, s) in &losses {
        assert!((r - s).abs() / s < 0.02, "replicas {r} vs one drafter {s}");
    }
    assert!(losses[4].0 < losses[0].0, "the replicas learn: {losses:?}");
    let o = run(&["bench", "replicas", "--drafter-devices", "cpu"]);
    assert_user_error(&o, &["--drafter-devices", "two or more"]);
}

#[test]
fn a_recorded_run_exports_a_chrome_trace_and_keeps_its_config_line() {
    let dir = tempfile::tempdir().unwrap();
    let rec = dir.path().join("run.jsonl");
    let o = train(&[
        "--steps",
        "8",
        "--record",
        rec.to_str().unwrap(),
        "--disable",
        "fused-adamw,graphs",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let config = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.starts_with("config: "))
        .map(str::to_string)
        .expect("a config: line");
    assert!(
        config.ends_with(" fast_paths=-graphs,-fused-adamw"),
        "{config}"
    );
    let out = dir.path().join("trace.json");
    let o = run(&[
        "export",
        rec.to_str().unwrap(),
        "--chrome",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The recording keeps the run's config: line, fast paths included.
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(
        said.lines().any(|l| l == format!("recorded run: {config}")),
        "{said}"
    );
    // The steps it counts are the drafter's; every thread's steps are spans.
    assert!(said.contains("(8 drafter steps, "), "{said}");
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let drafter_tid = events
        .iter()
        .find(|e| e["ph"] == "M" && e["args"]["name"] == "drafter-0")
        .map(|e| e["tid"].clone())
        .expect("a drafter-0 track");
    let forwards: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == drafter_tid && e["name"] == "forward")
        .collect();
    assert_eq!(forwards.len(), 8, "one forward slice per drafter step");
    let mut last_end = 0.0;
    for e in events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == drafter_tid)
    {
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts + 1e-3 >= last_end, "slices of a thread do not overlap");
        last_end = ts + e["dur"].as_f64().unwrap();
    }
    // A file that is not a recording: a sentence naming it.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"hello\": 1}\n").unwrap();
    let o = run(&[
        "export",
        bad.to_str().unwrap(),
        "--chrome",
        out.to_str().unwrap(),
    ]);
    assert_user_error(&o, &["bad.jsonl line 1", "train --record"]);
    let o = run(&["replay", dir.path().join("missing.jsonl").to_str().unwrap()]);
    assert_user_error(&o, &["missing.jsonl"]);
}

#[test]
fn a_batch_without_loss_tokens_is_no_optimizer_step() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("half.jsonl");
    // Rows of 32 tokens hold one 80-token document each (truncated): one with loss everywhere,
    // one with loss only past the row's end (none left in its row); a third with one loss token,
    // fewer than 2 (SpecForge's minimum), is dropped at start.
    let doc = |loss_from: usize| {
        let ids: Vec<u32> = (0..80).map(|i| (i * 7 + 3) % 500).collect();
        let mask: Vec<u8> = (0..80).map(|i| (i >= loss_from) as u8).collect();
        serde_json::json!({"input_ids": ids, "loss_mask": mask}).to_string()
    };
    std::fs::write(&data, format!("{}\n{}\n{}\n", doc(0), doc(40), doc(79))).unwrap();
    let save = dir.path().join("ck");
    let o = train(&[
        "--steps",
        "3",
        "--data",
        data.to_str().unwrap(),
        "--seq-len",
        "32",
        "--batch",
        "1",
        "--save-dir",
        save.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let data_line = out.lines().find(|l| l.starts_with("data:")).unwrap();
    // Documents come in a shuffled order, one of each kind per epoch: 3 batches with loss take
    // 2 or 3 without between them; every batch (one truncated document) is counted.
    let skipped = field(data_line, "skipped_batches").unwrap();
    assert!(skipped == 2.0 || skipped == 3.0, "{out}");
    assert_eq!(
        field(data_line, "truncated_docs"),
        Some(skipped + 3.0),
        "{out}"
    );
    // Every row is one truncated document, no padding: the data read is every token counted.
    let summary = out.lines().find(|l| l.starts_with("summary:")).unwrap();
    assert_eq!(
        field(data_line, "doc_tokens"),
        field(summary, "tokens"),
        "{out}"
    );
    // Three optimizer steps on the three batches with loss: AdamW's own count says so.
    let opt =
        tch::Tensor::read_safetensors(save.join("step-000003/optimizer.safetensors")).unwrap();
    let step = opt.iter().find(|(n, _)| n == "step").unwrap();
    assert_eq!(Vec::<i64>::try_from(&step.1).unwrap(), vec![3]);

    // A file with no loss at all would never step: refused up front.
    let none = dir.path().join("none.jsonl");
    std::fs::write(&none, format!("{}\n", doc(80))).unwrap();
    let o = train(&["--data", none.to_str().unwrap()]);
    assert_user_error(&o, &["none.jsonl", "loss_mask"]);
    // Nor would a file whose documents all have one loss token: refused, with the fix.
    let short = dir.path().join("short.jsonl");
    std::fs::write(&short, format!("{}\n", doc(79))).unwrap();
    let o = train(&["--data", short.to_str().unwrap()]);
    assert_user_error(&o, &["short.jsonl", "two consecutive loss tokens"]);
    // A document with fewer loss tokens than two blocks (10, block 16) trains, as in SpecForge.
    let few = dir.path().join("few.jsonl");
    std::fs::write(&few, format!("{}\n", doc(70))).unwrap();
    let o = train(&["--steps", "1", "--data", few.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn bench_generate_decodes_each_batch_and_refuses_a_bad_list() {
    let o = run(&[
        "bench",
        "generate",
        "--gen-batches",
        "1,4",
        "--gen-lengths",
        "16,8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("bench: generate "))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    for (line, batch) in lines.iter().zip(["batch=1 ", "batch=4 "]) {
        assert!(line.contains(batch) && line.contains("new=8 "), "{line}");
        assert!(field(line, "tok/s").is_some_and(|r| r > 0.0), "{line}");
    }
    let o = run(&["bench", "generate", "--gen-batches", "1,x"]);
    assert_user_error(&o, &["--gen-batches `1,x`", "positive numbers"]);
}

/// Issue 28: `--cupti` takes auto, on or off; `on` where nothing runs on CUDA is a sentence with
/// the fix; `bench engine` says each thread's CUDA calls, or why there are none.
#[test]
fn cupti_is_a_flag_whose_on_needs_cuda_and_bench_engine_reports_it() {
    let o = train(&["--steps", "1", "--cupti", "maybe"]);
    assert_user_error(&o, &["--cupti `maybe`", "auto, on or off"]);
    if crate::cuda_or_skip("--cupti on without a CUDA worker").is_none() {
        let o = train(&["--steps", "1", "--cupti", "on"]);
        assert_user_error(&o, &["--cupti on", "no worker runs on CUDA", "cuda:N"]);
    }
    let o = run(&["bench", "engine", "--steps", "3", "--cupti", "off"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("bench: cuda_calls "))
        .unwrap_or_else(|| panic!("no cuda_calls line: {out}"));
    assert!(line.starts_with("bench: cuda_calls cupti=off | "), "{line}");
    assert!(line.contains(" | drafter-0 launches=n/a (cpu)"), "{line}");
}

#[test]
fn bench_kernels_needs_cuda_the_engine_or_drafter_and_cupti_left_to_it() {
    let o = run(&["bench", "telemetry", "--kernels"]);
    assert_user_error(&o, &["--kernels", "bench telemetry"]);
    let o = run(&["bench", "drafter", "--steps", "1", "--kernels"]);
    assert_user_error(&o, &["--kernels times CUDA kernels", "--drafter-devices"]);
    // A count of kernels to list is taken (and checked the same way); a count that is not one
    // is clap's usage error.
    let o = run(&["bench", "drafter", "--steps", "1", "--kernels", "40"]);
    assert_user_error(&o, &["--kernels times CUDA kernels", "--drafter-devices"]);
    let o = run(&["bench", "drafter", "--kernels", "many"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    // A word that names no bench is only not a count: nothing about where a bench's name goes.
    let err = stderr(&o);
    assert!(
        err.contains("`many` is not a count") && !err.contains("bench's name"),
        "{err}"
    );
    // The bench's name after the flag: the flag takes it, and the sentence says where it goes.
    let o = run(&["bench", "--kernels", "engine"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = stderr(&o);
    assert!(
        err.contains("`engine` is not a count") && err.contains("`bench engine --kernels`"),
        "{err}"
    );
    let o = run(&[
        "bench",
        "engine",
        "--steps",
        "3",
        "--kernels",
        "--cupti",
        "on",
    ]);
    assert_user_error(&o, &["--kernels and --cupti on", "leave --cupti out"]);
    // The workers' devices default to the CPU, GPU or not.
    let o = run(&["bench", "engine", "--steps", "3", "--kernels"]);
    assert_user_error(&o, &["--kernels times CUDA kernels", "--target-devices"]);
}

/// `--target-precision fp8` on the CPU (the FP8 GEMMs emulated in f32): a run trains with the
/// target's projections in e4m3 and says so in its config line; `bench precision` finds each
/// captured layer's states near the bf16 target's but not equal to them (a quantization that did
/// nothing, or a broken one, fails); a value that is neither is one sentence naming the flag.
#[test]
fn an_fp8_target_trains_and_its_states_are_near_the_bf16_ones() {
    let o = train(&[
        "--preset",
        "tiny",
        "--steps",
        "4",
        "--target-precision",
        "fp8",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = super::support::stdout(&o);
    assert!(out.contains("target_precision=fp8"), "{out}");
    assert!(out.contains("step=4"), "{out}");

    let o = run(&["bench", "precision", "--preset", "tiny", "--steps", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = super::support::stdout(&o);
    let layers: Vec<(f64, f64)> = out
        .lines()
        .filter(|l| l.starts_with("bench: captured layer"))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let after = |key: &str| {
                let at = words.iter().position(|w| *w == key).expect(key);
                words[at + 1].parse::<f64>().unwrap()
            };
            (after("error"), after("cosine"))
        })
        .collect();
    assert_eq!(layers.len(), 2, "tiny's two captured layers: {out}");
    for (error, cosine) in layers {
        assert!(
            error > 1e-4 && error < 0.05,
            "relative error {error}: {out}"
        );
        assert!(cosine > 0.99, "cosine {cosine}: {out}");
    }

    let o = train(&[
        "--preset",
        "tiny",
        "--steps",
        "1",
        "--target-precision",
        "fp4",
    ]);
    assert_user_error(&o, &["--target-precision", "`fp4`", "bf16 or fp8"]);
    // Decoding runs the target in bf16: the flag there is refused, not ignored.
    let o = run(&["bench", "generate", "--target-precision", "fp8"]);
    assert_user_error(&o, &["--target-precision fp8", "bench generate"]);
}
