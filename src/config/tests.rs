//! Tests of the run configuration (src/config.rs): presets, TOML and flags into one `RunConfig`.

use super::*;
use crate::engine::train::blocks::AnchorScope;
use crate::engine::train::presets::Preset;
use crate::engine::train::recipe::STEP_PER_DOC;
use std::path::Path;

fn target_dir(tokenizer_ids: Option<i64>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = Preset::by_name("tiny").unwrap();
    let cfg = serde_json::to_string(&p.target).unwrap();
    std::fs::write(dir.path().join("config.json"), cfg).unwrap();
    if let Some(n) = tokenizer_ids {
        let vocab: serde_json::Map<String, serde_json::Value> =
            (0..n).map(|i| (format!("t{i}"), i.into())).collect();
        let tok = serde_json::json!({"model": {"type": "WordLevel", "vocab": vocab}});
        std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
    }
    dir
}

fn train(dir: &Path, extra: impl FnOnce(&mut TrainArgs)) -> Result<PipelineSpec> {
    let mut a = TrainArgs {
        target: Some(dir.to_path_buf()),
        ..TrainArgs::default()
    };
    extra(&mut a);
    RunConfig::from_args(&a).map(|c| c.pipeline)
}

#[test]
fn a_target_run_takes_specforge_recipe_not_the_tiny_preset() {
    let dir = target_dir(Some(300));
    let c = train(dir.path(), |_| {}).unwrap();
    assert_eq!(c.drafter_spec.layers.num_hidden_layers, 5);
    assert_eq!(c.drafter_spec.layers.hidden_size, 128, "the target's width");
    assert_eq!(
        (c.seq_len, c.anchors, c.drafter_spec.block_size),
        (3072, 512, 16)
    );
    assert_eq!(c.lr, 6e-4);
    assert_eq!(
        c.drafter_spec.mask_token_id, 300,
        "the first id the tokenizer leaves unused"
    );
    assert_eq!(
        (c.steps_per_batch, c.anchor_scope),
        (STEP_PER_DOC, AnchorScope::PerDoc),
        "a step a document, on its own anchors"
    );
    let line = c.recipe_line();
    assert!(line.starts_with("config: recipe=target "), "{line}");
    for kv in [
        "drafter_layers=5",
        "steps_per_batch=doc",
        "seq_len=3072",
        "anchors=512 anchor_budget=per-doc",
        "lr=6e-4",
        "block=16",
        "mask_token_id=300",
        "mask_from=first-unused-id",
        "schedule=constant(warmup=400)",
    ] {
        assert!(line.contains(kv), "no {kv} in {line}");
    }
    // A preset run keeps the preset's recipe.
    let tiny = RunConfig::from_args(&TrainArgs::default())
        .unwrap()
        .pipeline;
    assert_eq!(
        (tiny.seq_len, tiny.drafter_spec.layers.num_hidden_layers),
        (256, 2)
    );
    assert!(tiny.recipe_line().contains("recipe=preset:tiny"));
}

#[test]
fn a_target_run_with_several_drafters_takes_steps_a_row_not_a_step_a_document() {
    let dir = target_dir(Some(300));
    let toml = dir.path().join("budget.toml");
    std::fs::write(&toml, "anchor_budget = \"per-doc\"\n").unwrap();
    type Given = fn(&mut TrainArgs, &Path);
    // (what the user gives beside two drafters, steps a batch, budget, the config line's recipe):
    // each of the two values left to the recipe falls back to 6 steps a row on a budget per
    // row; what the user gave, by flag or TOML, stays.
    let cases: [(&str, Given, i64, AnchorScope, &str); 5] = [
        (
            "nothing",
            |_, _| {},
            6,
            AnchorScope::PerRow,
            "target-replicas",
        ),
        (
            "a budget per document",
            |a, _| a.anchor_budget = Some("per-doc".into()),
            6,
            AnchorScope::PerDoc,
            "target-replicas",
        ),
        (
            "3 steps a batch",
            |a, _| a.steps_per_batch = Some(3),
            3,
            AnchorScope::PerRow,
            "target-replicas",
        ),
        (
            "the budget in TOML",
            |a, toml| a.config = Some(toml.to_path_buf()),
            6,
            AnchorScope::PerDoc,
            "target-replicas",
        ),
        (
            "both",
            |a, _| {
                a.steps_per_batch = Some(2);
                a.anchor_budget = Some("per-row".into());
            },
            2,
            AnchorScope::PerRow,
            "target",
        ),
    ];
    for (given, set, steps, scope, from) in cases {
        let c = train(dir.path(), |a| {
            a.drafter_devices = Some("cpu,cpu".into());
            set(a, &toml);
        })
        .unwrap();
        assert_eq!(
            (c.steps_per_batch, c.anchor_scope),
            (steps, scope),
            "{given}"
        );
        let line = c.recipe_line();
        assert!(
            line.starts_with(&format!("config: recipe={from} ")),
            "{given}: {line}"
        );
    }
    // `doc` asked for by name with two drafters is still refused, by name.
    let e = train(dir.path(), |a| {
        a.drafter_devices = Some("cpu,cpu".into());
        a.steps_per_batch = Some(STEP_PER_DOC);
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("--steps-per-batch doc"), "{e:#}");
}

#[test]
fn flags_override_the_toml_file_which_overrides_the_recipe() {
    let dir = target_dir(Some(300));
    let toml = dir.path().join("run.toml");
    std::fs::write(
        &toml,
        "seq_len = 512\nanchors = 8\ndrafter_layers = 3\nlr = 1e-3\n\
         anchor_budget = \"per-doc\"\n[chat]\nenable_thinking = false\n\
         system_prompt = \"Be brief.\"\n",
    )
    .unwrap();
    let c = train(dir.path(), |a| {
        a.config = Some(toml.clone());
        a.anchors = Some(4);
        a.mask_token_id = Some(42);
    })
    .unwrap();
    assert_eq!((c.seq_len, c.anchors, c.lr), (512, 4, 1e-3));
    assert_eq!(c.anchor_scope, AnchorScope::PerDoc);
    assert_eq!(c.chat.enable_thinking, Some(false));
    assert_eq!(c.chat.system_prompt.as_deref(), Some("Be brief."));
    assert_eq!(c.drafter_spec.layers.num_hidden_layers, 3);
    assert_eq!(c.drafter_spec.mask_token_id, 42);
    assert!(c.recipe_line().contains("mask_from=given"));
    assert!(c.recipe_line().contains("anchors=4 anchor_budget=per-doc"));
    // The flag wins over the file; an unknown budget or `[chat]` key is named.
    let c = train(dir.path(), |a| {
        a.config = Some(toml.clone());
        a.anchor_budget = Some("per-row".into());
    })
    .unwrap();
    assert_eq!(c.anchor_scope, AnchorScope::PerRow);
    let e = train(dir.path(), |a| a.anchor_budget = Some("per-batch".into())).unwrap_err();
    assert!(
        format!("{e:#}").contains("--anchor-budget `per-batch`"),
        "{e:#}"
    );
    // Optimizer steps a batch: from the flag (the recipe line shows them), at least one.
    let c = train(dir.path(), |a| a.steps_per_batch = Some(3)).unwrap();
    assert_eq!(c.steps_per_batch, 3);
    assert!(c.recipe_line().contains("steps_per_batch=3"));
    let e = train(dir.path(), |a| a.steps_per_batch = Some(0)).unwrap_err();
    assert!(format!("{e:#}").contains("--steps-per-batch 0"), "{e:#}");
    // A step a document: `doc` on the command line and in the file, shown as `doc`.
    use crate::engine::train::recipe::parse_steps_per_batch;
    assert_eq!(parse_steps_per_batch("doc"), Ok(STEP_PER_DOC));
    assert_eq!(parse_steps_per_batch("4"), Ok(4));
    for bad in ["0", "-1", "docs"] {
        let e = parse_steps_per_batch(bad).unwrap_err();
        assert!(
            e.contains(&format!("`{bad}`")) && e.contains("`doc`"),
            "{e}"
        );
    }
    std::fs::write(&toml, "steps_per_batch = \"doc\"\n").unwrap();
    let c = train(dir.path(), |a| a.config = Some(toml.clone())).unwrap();
    assert_eq!(c.steps_per_batch, STEP_PER_DOC);
    assert!(c.recipe_line().contains("steps_per_batch=doc"));
    std::fs::write(&toml, "steps_per_batch = 0\n").unwrap();
    let e = train(dir.path(), |a| a.config = Some(toml.clone())).unwrap_err();
    assert!(format!("{e:#}").contains("`steps_per_batch` `0`"), "{e:#}");
    // Replicas step together; their batches hold different counts of documents.
    let e = train(dir.path(), |a| {
        a.steps_per_batch = Some(STEP_PER_DOC);
        a.drafter_devices = Some("cpu,cpu".into());
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("--steps-per-batch doc"), "{e:#}");
    std::fs::write(&toml, "[chat]\nthinking = true\n").unwrap();
    let e = train(dir.path(), |a| a.config = Some(toml.clone())).unwrap_err();
    assert!(
        format!("{e:#}").contains("unknown field `thinking`"),
        "{e:#}"
    );
}

#[test]
fn no_mask_token_is_refused_with_the_files_and_the_fix() {
    for ids in [None, Some(512)] {
        let dir = target_dir(ids);
        let e = format!("{:#}", train(dir.path(), |_| {}).unwrap_err());
        for m in [
            "tokenizer_config.json",
            "tokenizer.json",
            "--mask-token-id",
            "mask_token_id",
        ] {
            assert!(e.contains(m), "no {m} in {e}");
        }
    }
    let dir = target_dir(None);
    let e = train(dir.path(), |a| a.mask_token_id = Some(512)).unwrap_err();
    assert!(
        e.to_string().contains("outside the target's vocabulary"),
        "{e}"
    );
}

#[test]
fn data_threads_come_from_the_flag_or_toml_and_a_silly_count_is_refused() {
    let args = |n| TrainArgs {
        data_threads: Some(n),
        ..TrainArgs::default()
    };
    assert_eq!(
        RunConfig::from_args(&args(0))
            .unwrap()
            .pipeline
            .data_threads,
        Some(0)
    );
    let e = RunConfig::from_args(&args(65)).unwrap_err().to_string();
    assert!(e.contains("--data-threads"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("run.toml");
    std::fs::write(&toml, "data_threads = 3\n").unwrap();
    let c = RunConfig::from_args(&TrainArgs {
        config: Some(toml),
        ..TrainArgs::default()
    })
    .unwrap();
    assert_eq!(c.pipeline.data_threads, Some(3));
}

#[test]
fn fast_paths_come_from_the_flag_or_toml_and_show_in_the_config_line() {
    let c = RunConfig::from_args(&TrainArgs {
        disable: Some("graphs,fused-adamw".into()),
        ..TrainArgs::default()
    })
    .unwrap()
    .pipeline;
    use crate::engine::gpu::fast_paths::FastPath;
    assert!(!c.fast_paths.is_on(FastPath::Graphs));
    assert!(c.fast_paths.is_on(FastPath::TargetKernels));
    assert!(c
        .recipe_line()
        .ends_with(" fast_paths=-graphs,-fused-adamw"));
    let tiny = RunConfig::from_args(&TrainArgs::default())
        .unwrap()
        .pipeline;
    assert!(tiny.recipe_line().ends_with(" fast_paths=all"));

    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("run.toml");
    let with = |text: &str, flag: Option<&str>| {
        std::fs::write(&toml, text).unwrap();
        RunConfig::from_args(&TrainArgs {
            config: Some(toml.clone()),
            disable: flag.map(Into::into),
            ..TrainArgs::default()
        })
    };
    let c = with(
        "[fast_paths]\ndisable = [\"flash-target\"]\nwindow_groups = 1\ntile_anchors = 8\n",
        None,
    )
    .unwrap()
    .pipeline;
    assert_eq!(
        c.fast_paths.describe(),
        "-flash-target,window_groups=1,tile_anchors=8"
    );
    // The flag's list replaces the file's.
    let c = with(
        "[fast_paths]\ndisable = [\"flash-target\"]\n",
        Some("graphs"),
    )
    .unwrap()
    .pipeline;
    assert_eq!(c.fast_paths.describe(), "-graphs");
    for (text, flag, says) in [
        ("", Some("graph"), "--disable: no fast path `graph`"),
        (
            "[fast_paths]\ndisable = [\"adamw\"]\n",
            None,
            "`disable` in [fast_paths]: no fast path `adamw`",
        ),
        (
            "[fast_paths]\nwindow_groups = 0\n",
            None,
            "`window_groups` 0 in [fast_paths]",
        ),
        (
            "[fast_paths]\ntile_anchors = 256\n",
            None,
            "`tile_anchors` 256 in [fast_paths] is out of range: use 1 to 128",
        ),
    ] {
        let e = format!("{:#}", with(text, flag).unwrap_err());
        assert!(e.contains(says), "{e}");
    }
}

#[test]
fn warnings_come_from_the_toml_and_a_bad_key_or_value_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("run.toml");
    let with = |text: &str| {
        std::fs::write(&toml, text).unwrap();
        RunConfig::from_args(&TrainArgs {
            config: Some(toml.clone()),
            ..TrainArgs::default()
        })
    };
    let c = with(
        "[warnings]\nstarved_s = 3.5\noff = [\"blocked\"]\n\
         [warnings.severity]\nstarved = \"error\"\n",
    )
    .unwrap();
    assert_eq!(c.viewer.warnings.starved_s, 3.5);
    assert_eq!(c.viewer.warnings.off, ["blocked"]);
    assert_eq!(
        c.viewer.warnings.gpu_idle_s,
        WarnConfig::default().gpu_idle_s
    );
    assert_eq!(
        with("").unwrap().viewer.warnings,
        WarnConfig::default(),
        "documented defaults without the table"
    );
    for (text, want) in [
        ("[warnings]\nstarve_s = 3\n", "unknown field `starve_s`"),
        ("[warnings]\nstarved_s = \"ten\"\n", "starved_s = \"ten\""),
        ("[warnings]\nstarved_s = -2.0\n", "`warnings.starved_s` -2"),
        ("[warnings]\noff = [\"idle\"]\n", "unknown rule `idle`"),
    ] {
        let e = format!("{:#}", with(text).unwrap_err());
        assert!(e.contains(want) && e.contains("run.toml"), "{want}: {e}");
    }
}

#[test]
fn every_preset_resolves_without_building_its_model() {
    // Resolving a run's configuration allocates nothing: qwen3-32b (65 GB in bf16) resolves on
    // any host, with the FLOP ratio the placement advice starts from.
    for name in crate::engine::train::presets::PRESETS {
        let c = RunConfig::from_args(&TrainArgs {
            preset: Some(name.into()),
            ..TrainArgs::default()
        })
        .unwrap()
        .pipeline;
        let line = c.recipe_line();
        assert!(line.contains(&format!("recipe=preset:{name} ")), "{line}");
        let ratio = crate::engine::model::flops::flop_ratio(
            &c.target_config,
            &c.drafter_spec,
            c.seq_len,
            c.anchors,
        );
        assert!(ratio.is_finite() && ratio > 0.0, "{name}: {ratio}");
    }
}

/// Rows up to 64K tokens are taken (reasoning data runs to 32K); one token more is refused with
/// the range.
#[test]
fn long_rows_are_taken_up_to_the_cap_and_refused_past_it() {
    let dir = target_dir(Some(300));
    for seq in [8192, 32768, crate::engine::spec::MAX_SEQ_LEN] {
        let c = train(dir.path(), |a| a.seq_len = Some(seq)).unwrap();
        assert_eq!(c.seq_len, seq);
    }
    let e = train(dir.path(), |a| a.seq_len = Some(65_537)).unwrap_err();
    assert!(
        format!("{e:#}").contains(
            "--seq-len 65537 is out of range: use 32..=65536 (`seq_len` in a --config file)"
        ),
        "{e:#}"
    );
}

/// Reading the configuration loads nothing: `--cupti` is kept as asked for until `apply`, which
/// on a machine without a CUDA worker says why nothing is counted; `on` there is refused while
/// reading, naming the flag.
#[test]
fn reading_the_configuration_is_pure_and_apply_installs() {
    use crate::engine::gpu::cupti::{CuptiState, Setting};
    let c = RunConfig::from_args(&TrainArgs::default()).unwrap();
    assert_eq!(
        c.pipeline.cupti,
        CuptiState::Requested {
            setting: Setting::Auto,
            uses_cuda: false
        }
    );
    assert!(c.pipeline.recipe_line().contains(" cupti=auto "));
    let applied = c.apply().unwrap();
    assert_eq!(
        applied.pipeline.cupti,
        CuptiState::NotCounting("no CUDA device in use".into())
    );
    let e = RunConfig::from_args(&TrainArgs {
        cupti: Some("on".into()),
        ..TrainArgs::default()
    })
    .unwrap_err();
    assert!(
        format!("{e:#}").contains("--cupti on: no worker runs on CUDA"),
        "{e:#}"
    );
}

mod fp8;
mod host_memory;
mod optimizer_states;
mod placement;
