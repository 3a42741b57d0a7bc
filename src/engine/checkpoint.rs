//! Drafter checkpoints as Hugging Face directories that z-lab's `dflash` package loads:
//! config.json (a Qwen3 config plus `num_target_layers`, `block_size` and `dflash_config`),
//! model.safetensors in bf16 with the drafter's own names, and beside them the optimizer state
//! (the fp32 master weights and the AdamW moments) and the trainer state. A checkpoint is written into a temporary directory and renamed into place, so
//! it is never half written.

pub mod checksum;
pub mod save_dir;

use crate::engine::model::shapes::{DrafterSpec, Qwen3Config};
use crate::engine::model::tensor_file::{write_one_at_a_time, Pending};
use crate::engine::train::optim::AdamW;
use crate::engine::train::schedule::Schedule;
use crate::scratch::Scratch;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::{Path, PathBuf};
use tch::nn::VarStore;

pub const MODEL_FILE: &str = "model.safetensors";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_FILE: &str = "trainer_state.json";

/// Where a run stands, saved beside the weights: with the weights and the AdamW moments, all
/// that a resumed run needs to continue exactly as if it had not stopped (on the CPU).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps taken.
    pub step: u64,
    /// The cosine schedule's total (0 for an open run); `schedule` says which.
    pub total_steps: u64,
    pub seed: u64,
    /// Peak learning rate.
    pub lr: f64,
    /// Absent in checkpoints of earlier versions: cosine over `total_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
    /// Documents the run has taken from its data source (the next batch starts after them).
    #[serde(default)]
    pub data_docs: u64,
    /// State of the anchor sampler's generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_rng: Option<u64>,
    /// Loss of the last step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_loss: Option<f32>,
    /// The data recipe of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchors: Option<i64>,
    /// Absent in checkpoints of earlier versions, which budgeted per row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchor_scope: Option<crate::engine::train::blocks::AnchorScope>,
    /// Optimizer steps a batch; absent in checkpoints of earlier versions, which took one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_per_batch: Option<i64>,
    /// Saved partway through a batch's steps: the steps of that batch already taken. Then
    /// `data_docs` and `anchor_rng` are as before the batch, so a resumed run takes the same
    /// batch again, draws the same anchors and goes on from the next of its steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_steps_done: Option<u64>,
    /// How the AdamW moments are kept (`f32` or `bf16`); absent in checkpoints of earlier
    /// versions, whose moments were f32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_states: Option<String>,
}

impl TrainerState {
    /// The run's lr schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule.unwrap_or(Schedule::Cosine {
            total: self.total_steps,
        })
    }
}

/// config.json of a drafter.
pub fn drafter_config_json(spec: &DrafterSpec) -> serde_json::Value {
    let c = &spec.layers;
    json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": rope_parameters(c),
        "vocab_size": c.vocab_size,
        // The drafter predicts over the whole vocabulary, through the target's lm head.
        "draft_vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings.unwrap_or(40960),
        "hidden_act": "silu",
        "attention_bias": c.attention_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": false,
        // The weights file holds bf16 (the fp32 master weights are in the optimizer file);
        // transformers 5 reads `dtype`, earlier loaders `torch_dtype`.
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
        "use_cache": true,
        "layer_types": c.layer_types.clone().unwrap_or_else(|| vec!["full_attention".into(); c.num_hidden_layers as usize]),
        "sliding_window": c.sliding_window,
        // Without it transformers drops the window when dflash loads the config.
        "use_sliding_window": c.sliding_window.is_some(),
        "num_target_layers": spec.num_target_layers,
        "block_size": spec.block_size,
        "dflash_config": {
            "target_layer_ids": spec.target_layer_ids,
            "mask_token_id": spec.mask_token_id,
            "mask_token": spec.mask_token,
            "block_size": spec.block_size,
        },
    })
}

/// `rope_parameters` as transformers 5 reads them: the base, and llama3's scaling where the
/// target has it (the drafter rotates as its target does).
fn rope_parameters(c: &Qwen3Config) -> serde_json::Value {
    match c.rope_llama3 {
        None => json!({"rope_type": "default", "rope_theta": c.rope_theta}),
        Some(s) => json!({
            "rope_type": "llama3",
            "rope_theta": c.rope_theta,
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        }),
    }
}

/// Reads a drafter directory's config.json.
pub fn read_drafter_spec(dir: &Path) -> Result<DrafterSpec> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}: --drafter/--resume need a drafter directory",
            path.display()
        )
    })?;
    let damaged = || {
        format!(
            "{} is not a valid drafter config: fix or restore it, or use an earlier checkpoint",
            path.display()
        )
    };
    let layers = Qwen3Config::from_json(&text).with_context(damaged)?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(damaged)?;
    let d = v.get("dflash_config").cloned().unwrap_or(json!({}));
    let pick = |k: &str| d.get(k).or_else(|| v.get(k)).cloned();
    refuse_unsupported(&v, &pick).with_context(|| {
        format!(
            "{}: this drafter cannot be trained here; start a fresh one (no --drafter) or use a \
             DFlash (1) drafter without it",
            path.display()
        )
    })?;
    let num_target_layers = pick("num_target_layers")
        .and_then(|x| x.as_i64())
        .with_context(|| format!("{} has no `num_target_layers`", path.display()))?;
    let target_layer_ids = match pick("target_layer_ids") {
        Some(x) => serde_json::from_value(x).with_context(|| {
            format!(
                "{}: `target_layer_ids` must be a list of integers",
                path.display()
            )
        })?,
        None => crate::engine::model::shapes::build_target_layer_ids(
            num_target_layers,
            layers.num_hidden_layers,
        ),
    };
    let mask_token_id = pick("mask_token_id")
        .and_then(|x| x.as_i64())
        .with_context(|| format!("{} has no `dflash_config.mask_token_id`", path.display()))?;
    let block_size = pick("block_size").and_then(|x| x.as_i64()).unwrap_or(16);
    let slots = crate::telemetry::phase_recorder::MAX_SLOTS as i64;
    if !(2..=slots).contains(&block_size) {
        bail!(
            "{}: `block_size` {block_size} is out of range: a drafter's block is 2 to {slots} \
             tokens; fix the file or use another drafter",
            path.display()
        );
    }
    if target_layer_ids.is_empty() || num_target_layers < 1 {
        bail!(
            "{}: `target_layer_ids` and `num_target_layers` must name at least one target layer",
            path.display()
        );
    }
    let mask_token = pick("mask_token")
        .and_then(|x| x.as_str().map(str::to_string))
        .unwrap_or_else(|| crate::engine::model::shapes::DEFAULT_MASK_TOKEN.into());
    Ok(DrafterSpec {
        layers,
        target_layer_ids,
        block_size,
        mask_token_id,
        mask_token,
        num_target_layers,
    })
}

/// The settings of dflash's config that this trainer does not apply, refused by name when set
/// to something that changes the model: `input_embedding_scale` and `output_multiplier` other
/// than 1, `final_logit_softcapping` above 0, DFlash2 drafters (`DFlash2DraftModel`, its
/// convolutions and candidate selector), and `is_causal` (which makes dflash run every layer
/// causally, or none).
fn refuse_unsupported(
    v: &serde_json::Value,
    pick: &dyn Fn(&str) -> Option<serde_json::Value>,
) -> Result<()> {
    let num = |k: &str| pick(k).and_then(|x| x.as_f64());
    for key in ["input_embedding_scale", "output_multiplier"] {
        if let Some(x) = num(key).filter(|x| *x != 1.0) {
            bail!("`{key}` is {x}: only 1 is supported");
        }
    }
    if let Some(x) = num("final_logit_softcapping").filter(|x| *x > 0.0) {
        bail!("`final_logit_softcapping` is {x}: logit soft-capping is not supported");
    }
    let dflash2 = v
        .get("architectures")
        .and_then(|a| a.as_array())
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some("DFlash2DraftModel")))
        || ["conv_kernel_size", "selector_rank"]
            .iter()
            .any(|k| pick(k).is_some());
    if dflash2 {
        bail!("it is a DFlash2 drafter (`DFlash2DraftModel`: convolutions and a candidate selector), which is not supported");
    }
    if let Some(c) = v.get("is_causal").and_then(|x| x.as_bool()) {
        bail!("`is_causal` is {c}: dflash would run every layer that way; only per-layer causality (sliding layers causal, full ones not) is supported");
    }
    Ok(())
}

/// Writes a checkpoint to `dir` atomically: every file into a temporary directory beside it,
/// each file and the directory fsynced, then renamed into place and the parent fsynced. A failed
/// save (a full disk, any write error) removes its temporary directory, leaves any earlier
/// checkpoint as it was, and says which directory could not be written.
pub fn save(
    dir: &Path,
    spec: &DrafterSpec,
    vs: &VarStore,
    opt: &AdamW,
    state: &TrainerState,
) -> Result<PathBuf> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let failed = |what: String| {
        format!(
            "cannot save the checkpoint {}: {what}; earlier checkpoints are intact — {}",
            dir.display(),
            crate::engine::checkpoint::save_dir::fix_for(&what)
        )
    };
    if let Err(e) = std::fs::create_dir_all(parent) {
        bail!(
            "{}",
            failed(format!("cannot create {} ({e})", parent.display()))
        );
    }
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("checkpoint");
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    // Scratch until placed: a second signal's exit removes it (src/scratch.rs).
    let scratch = match Scratch::create(&tmp, |t| std::fs::create_dir_all(t)) {
        Ok(s) => s,
        Err(e) => bail!(
            "{}",
            failed(format!("cannot create {} ({e})", tmp.display()))
        ),
    };
    if crate::fault::is("save_slow") {
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    if let Err(e) = write_files(scratch.path(), spec, vs, opt, state) {
        let _ = std::fs::remove_dir_all(scratch.path());
        bail!("{}", failed(format!("{e:#}")));
    }
    // The renames run with a forced exit held off: the directory is the old one or the new one.
    let placed = scratch.settle(|tmp| place(tmp, dir, parent, name));
    if let Err(e) = placed {
        bail!("{}", failed(e.to_string()));
    }
    Ok(dir.to_path_buf())
}

/// The checkpoint's files written into `tmp`, each fsynced, then `tmp` itself.
fn write_files(
    tmp: &Path,
    spec: &DrafterSpec,
    vs: &VarStore,
    opt: &AdamW,
    state: &TrainerState,
) -> Result<()> {
    let cfg = serde_json::to_string_pretty(&drafter_config_json(spec))?;
    std::fs::write(tmp.join("config.json"), cfg)?;
    if crate::fault::is("save_write") {
        bail!("injected write failure (DFLASH_TOP_FAULT=save_write)");
    }
    // Weights on the CPU in bf16, what a serving engine loads; the fp32 master weights go
    // into the optimizer file, from which a resumed run continues exactly.
    // A tensor brought to the host and written at a time (src/engine/model/tensor_file.rs).
    let mut vars: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let pending: Vec<Pending> = vars
        .iter()
        .map(|(name, v)| Pending {
            name: name.clone(),
            kind: tch::Kind::BFloat16,
            shape: v.size(),
            make: Box::new(move || {
                let v = v.detach().to_device(tch::Device::Cpu);
                v.to_kind(tch::Kind::BFloat16)
            }),
        })
        .collect();
    write_one_at_a_time(&tmp.join(MODEL_FILE), &pending)?;
    opt.save(&tmp.join(OPTIMIZER_FILE))?;
    std::fs::write(tmp.join(TRAINER_FILE), serde_json::to_string_pretty(state)?)?;
    let files = ["config.json", MODEL_FILE, OPTIMIZER_FILE, TRAINER_FILE];
    crate::engine::checkpoint::checksum::write(tmp, &files)?;
    for f in files
        .iter()
        .chain([&crate::engine::checkpoint::checksum::CHECKSUM_FILE])
    {
        sync_path(&tmp.join(f))?;
    }
    sync_path(tmp)?;
    Ok(())
}

/// `tmp` renamed to `dir` (an earlier `dir` moved aside, then removed) and `parent` fsynced; on
/// failure `tmp` is removed.
fn place(tmp: &Path, dir: &Path, parent: &Path, name: &str) -> std::io::Result<()> {
    let placed = if dir.exists() {
        let old = parent.join(format!(".{name}.old-{}", std::process::id()));
        std::fs::rename(dir, &old)
            .and_then(|()| std::fs::rename(tmp, dir))
            .map(|()| {
                let _ = std::fs::remove_dir_all(old);
            })
    } else {
        std::fs::rename(tmp, dir)
    };
    let placed = placed.and_then(|()| sync_path(parent));
    if placed.is_err() {
        let _ = std::fs::remove_dir_all(tmp);
    }
    placed
}

/// fsync of a file or a directory (opened read-only; Linux allows fsync on both).
fn sync_path(p: &Path) -> std::io::Result<()> {
    std::fs::File::open(p)?.sync_all()
}

/// Keeps the newest `keep` `step-*` checkpoints in `save_dir` (by step number) and removes the
/// others; returns the ones removed. Other entries are never touched. Each is renamed out of the
/// `step-*` names before it is removed, so an exit part way leaves no damaged checkpoint.
pub fn prune(save_dir: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let steps = crate::save_layout::checkpoints_in(save_dir)
        .with_context(|| format!("cannot list {}", save_dir.display()))?;
    let drop = steps.len().saturating_sub(keep.max(1));
    let mut removed = Vec::new();
    for p in steps.into_iter().take(drop) {
        let name = p.file_name().unwrap_or_default().to_string_lossy();
        let doomed = save_dir.join(format!(".{name}.del-{}", std::process::id()));
        let gone = Scratch::create(&doomed, |d| std::fs::rename(&p, d))
            .and_then(|s| std::fs::remove_dir_all(s.path()));
        gone.with_context(|| format!("cannot remove {}", p.display()))?;
        removed.push(p);
    }
    Ok(removed)
}

pub fn read_trainer_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(TRAINER_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {}: --resume needs a checkpoint saved by dflash-top",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is malformed: the checkpoint is damaged; resume from an earlier checkpoint",
            path.display()
        )
    })
}

/// Loads drafter weights from a directory into `vs` (names must match exactly).
pub fn load_weights(dir: &Path, vs: &VarStore) -> Result<()> {
    let file = dir.join(MODEL_FILE);
    if !file.exists() {
        bail!(
            "{} is missing: a drafter directory needs its weights",
            file.display()
        );
    }
    let weights = crate::engine::model::weights::WeightFiles::open(dir)?;
    let unused = crate::engine::model::weights::copy_into(vs, &weights, &file)?;
    weights.report_done();
    if !unused.is_empty() {
        eprintln!(
            "dflash-top: note: {} tensor(s) in {} are not part of the drafter and were skipped (e.g. {})",
            unused.len(),
            file.display(),
            unused[0]
        );
    }
    Ok(())
}
