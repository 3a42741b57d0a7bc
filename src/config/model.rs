//! What a run trains: the target (a preset's or a Hugging Face directory), the recipe (flags over
//! the TOML file over a resumed run's values over the base recipe) and the drafter (a
//! checkpoint's, or a fresh one with its mask token), each error naming the flag or file.

use super::FileConfig;
use crate::config::cli::TrainArgs;
use crate::engine::checkpoint;
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::model::shapes::{drafter_spec_for, DrafterSpec, Qwen3Config};
use crate::engine::train::blocks::AnchorScope;
use crate::engine::train::optim::moments::MomentPrecision;
use crate::engine::train::presets::Preset;
use crate::engine::train::recipe::{mask_token_of, MaskToken};
use crate::engine::train::recipe::{Recipe, STEP_PER_DOC};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The models of a run and where their settings came from.
pub(super) struct Model {
    pub preset: Preset,
    /// The target's directory (`--target`); None: the preset's random target.
    pub target: Option<PathBuf>,
    pub target_config: Qwen3Config,
    /// How the target's linear layers compute (`--target-precision`).
    pub target_precision: TargetPrecision,
    /// How the drafter's AdamW keeps its moments (`--optimizer-states`).
    pub optimizer_states: MomentPrecision,
    /// `specforge` or `preset:NAME`: the base the recipe started from.
    pub recipe_from: String,
    pub recipe: Recipe,
    /// The lr the flags or the TOML file gave (a resumed schedule is checked against it).
    pub lr_given: Option<f64>,
    /// A resumed run's trainer state (`--resume`).
    pub resume_state: Option<checkpoint::TrainerState>,
    /// The drafter to start from (`--drafter`).
    pub drafter: Option<PathBuf>,
    pub drafter_spec: DrafterSpec,
    /// Where the drafter's mask token came from.
    pub mask_from: String,
}

impl Model {
    /// What a target and a drafter of this run hold on a GPU (src/engine/model/memory.rs).
    pub fn memory_need(&self) -> crate::engine::model::memory::MemoryNeed {
        crate::engine::model::memory::need(
            &self.target_config,
            self.target_precision,
            self.optimizer_states.bytes(),
            &self.drafter_spec,
            self.recipe.seq_len,
            self.recipe.anchors,
            self.recipe.batch,
        )
    }

    /// The target, then the resumed state, then the recipe, then the drafter.
    pub fn of(args: &TrainArgs, file: &FileConfig) -> Result<Model> {
        let preset_name = args
            .preset
            .clone()
            .or(file.preset.clone())
            .unwrap_or_else(|| "tiny".into());
        let preset = Preset::by_name(&preset_name)?;
        let target = args.target.clone().or(file.target.clone());
        let target_config = target_config_of(target.as_deref(), &preset)?;
        let given = args.target_precision.as_deref();
        let target_precision = choice(
            ("--target-precision", "target_precision", "bf16 or fp8"),
            given.or(file.target_precision.as_deref()),
            TargetPrecision::parse,
        )?
        .unwrap_or_default();
        // A --target run: SpecForge's recipe, a step a document (with several drafter replicas,
        // 6 steps a row: src/config.rs); a preset run: the preset's. Then TOML, then flags.
        let (base, recipe_from) = match &target {
            Some(_) => (Recipe::for_target(), "target".to_string()),
            None => (preset.recipe.clone(), format!("preset:{}", preset.name)),
        };
        let resume_state = super::resume::resume_state_of(args, file)?;
        let recipe = recipe_of(args, file, &base, resume_state.as_ref())?;
        let optimizer_states = optimizer_states_of(args, file, resume_state.as_ref())?;
        if recipe.steps_per_batch < 1 && recipe.steps_per_batch != STEP_PER_DOC {
            anyhow::bail!(
                "--steps-per-batch {}: give 1 or more optimizer steps a batch, or `doc`",
                recipe.steps_per_batch
            );
        }
        if let Some(state) = &resume_state {
            super::resume::check_batch_steps(state, &recipe, args.resume.as_deref())?;
        }
        let drafter = args.drafter.clone().or(file.drafter.clone());
        let explicit = Explicit {
            drafter_layers: args.drafter_layers.or(file.drafter_layers),
            block_size: args.block_size.or(file.block_size),
            mask_token_id: args.mask_token_id.or(file.mask_token_id),
        };
        let from = args.resume.as_ref().or(drafter.as_ref());
        let (drafter_spec, mask_from) = resolve_drafter(
            from.map(PathBuf::as_path),
            target.as_deref(),
            &target_config,
            &preset,
            &recipe,
            &explicit,
        )?;
        Ok(Model {
            preset,
            target,
            target_config,
            target_precision,
            optimizer_states,
            recipe_from,
            recipe,
            lr_given: args.lr.or(file.lr),
            resume_state,
            drafter,
            drafter_spec,
            mask_from,
        })
    }
}

/// A named choice given by a flag or a TOML key (`names`: the flag, the key, the values
/// allowed), parsed; a value of none is one sentence naming both and the values.
fn choice<T>(
    (flag, key, allowed): (&str, &str, &str),
    given: Option<&str>,
    parse: fn(&str) -> Option<T>,
) -> Result<Option<T>> {
    given
        .map(|name| {
            parse(name)
                .with_context(|| format!("{flag} (or the TOML's {key}) `{name}`: use {allowed}"))
        })
        .transpose()
}

/// How the AdamW moments are kept: as the flag or the TOML file says, else as the resumed run
/// kept them (its trainer_state.json), else f32.
fn optimizer_states_of(
    args: &TrainArgs,
    file: &FileConfig,
    resumed: Option<&checkpoint::TrainerState>,
) -> Result<MomentPrecision> {
    let given = args.optimizer_states.as_deref();
    let names = ("--optimizer-states", "optimizer_states", "f32 or bf16");
    if let Some(m) = choice(
        names,
        given.or(file.optimizer_states.as_deref()),
        MomentPrecision::parse,
    )? {
        return Ok(m);
    }
    let Some(name) = resumed.and_then(|s| s.optimizer_states.as_deref()) else {
        return Ok(MomentPrecision::default());
    };
    MomentPrecision::parse(name).with_context(|| {
        format!(
            "{}: `optimizer_states` is `{name}`, neither f32 nor bf16: the checkpoint is \
             damaged; give --optimizer-states",
            args.resume
                .as_deref()
                .unwrap_or(Path::new("--resume"))
                .join("trainer_state.json")
                .display()
        )
    })
}

/// The target's shapes: its directory's config.json, else the preset's.
fn target_config_of(target: Option<&Path>, preset: &Preset) -> Result<Qwen3Config> {
    if let Some(d) = target {
        if !d.is_dir() {
            bail!(
                "--target {}: no such directory; give a Hugging Face Qwen3, Llama or Qwen2 \
                 directory",
                d.display()
            );
        }
    }
    match target {
        Some(dir) => Qwen3Config::from_dir(dir),
        None => Ok(preset.target.clone()),
    }
}

/// Each value from its flag, else the TOML file, else (where a resumed run keeps it) the
/// checkpoint, else the base recipe.
fn recipe_of(
    args: &TrainArgs,
    file: &FileConfig,
    base: &Recipe,
    resume_state: Option<&checkpoint::TrainerState>,
) -> Result<Recipe> {
    let saved = |f: fn(&checkpoint::TrainerState) -> Option<i64>| resume_state.and_then(f);
    Ok(Recipe {
        drafter_layers: args
            .drafter_layers
            .or(file.drafter_layers)
            .unwrap_or(base.drafter_layers),
        block_size: args
            .block_size
            .or(file.block_size)
            .unwrap_or(base.block_size),
        seq_len: args
            .seq_len
            .or(file.seq_len)
            .or(saved(|s| s.seq_len))
            .unwrap_or(base.seq_len),
        batch: args
            .batch
            .or(file.batch)
            .or(saved(|s| s.batch))
            .unwrap_or(base.batch),
        anchors: args
            .anchors
            .or(file.anchors)
            .or(saved(|s| s.anchors))
            .unwrap_or(base.anchors),
        anchor_scope: match args
            .anchor_budget
            .as_deref()
            .or(file.anchor_budget.as_deref())
        {
            Some(name) => AnchorScope::parse(name)
                .with_context(|| format!("--anchor-budget `{name}`: use per-doc or per-row"))?,
            // A resumed run keeps its budget; checkpoints without one budgeted per row.
            None => match resume_state {
                Some(s) => s.anchor_scope.unwrap_or(AnchorScope::PerRow),
                None => base.anchor_scope,
            },
        },
        // A resumed run keeps its steps a row; checkpoints without them took one.
        steps_per_batch: args
            .steps_per_batch
            .or(file.steps_per_batch)
            .or(resume_state.map(|s| s.steps_per_batch.unwrap_or(1)))
            .unwrap_or(base.steps_per_batch),
        lr: args
            .lr
            .or(file.lr)
            .or(resume_state.map(|s| s.lr))
            .unwrap_or(base.lr),
    })
}

/// Recipe values the user gave (flag or TOML), as opposed to defaults.
struct Explicit {
    drafter_layers: Option<i64>,
    block_size: Option<i64>,
    mask_token_id: Option<i64>,
}

/// The drafter of the run and where its mask token came from: a checkpoint's (--resume,
/// --drafter), or a fresh one of `recipe.drafter_layers` layers whose mask token is the one the
/// user gave, else the target tokenizer's, else (no --target) the preset's.
fn resolve_drafter(
    from: Option<&Path>,
    target: Option<&Path>,
    target_config: &Qwen3Config,
    preset: &Preset,
    recipe: &Recipe,
    explicit: &Explicit,
) -> Result<(DrafterSpec, String)> {
    let (spec, mask_from) = match from {
        Some(dir) => checkpoint_drafter(dir, explicit)?,
        None => {
            let mask = mask_token(explicit, target, target_config, preset)?;
            fresh_drafter(target_config, recipe, mask)?
        }
    };
    crate::engine::train::recipe::check_pair(&spec, target_config)?;
    Ok((spec, mask_from))
}

/// A checkpoint's drafter; a recipe value the user gave that contradicts it is refused.
fn checkpoint_drafter(dir: &Path, explicit: &Explicit) -> Result<(DrafterSpec, String)> {
    if !dir.is_dir() {
        bail!(
            "--resume/--drafter {}: no such directory; give a drafter checkpoint \
             directory",
            dir.display()
        );
    }
    let spec = checkpoint::read_drafter_spec(dir)?;
    let cfg = dir.join("config.json");
    let clash = [
        (
            "drafter_layers",
            explicit.drafter_layers,
            spec.layers.num_hidden_layers,
        ),
        ("block_size", explicit.block_size, spec.block_size),
        ("mask_token_id", explicit.mask_token_id, spec.mask_token_id),
    ];
    for (key, given, has) in clash {
        if let Some(g) = given.filter(|g| *g != has) {
            bail!(
                "`{key}` {g} contradicts the drafter in {} ({key} {has}): leave the flag \
                 or TOML key out, or train a fresh drafter",
                cfg.display()
            );
        }
    }
    Ok((spec, format!("checkpoint:{}", cfg.display())))
}

/// A fresh drafter's mask token: the one the user gave, else the target tokenizer's, else (no
/// --target) the preset's.
fn mask_token(
    explicit: &Explicit,
    target: Option<&Path>,
    target_config: &Qwen3Config,
    preset: &Preset,
) -> Result<MaskToken> {
    Ok(match (explicit.mask_token_id, target) {
        (Some(id), _) => MaskToken {
            id,
            source: "given".into(),
            content: None,
        },
        (None, Some(dir)) => mask_token_of(dir, target_config.vocab_size)?.with_context(|| {
            format!(
                "--target {}: no mask token: neither tokenizer_config.json \
                 (`added_tokens_decoder`) nor tokenizer.json (`added_tokens`) has a \
                 `<|MASK|>`-like token, tokenizer.json leaves no unused id below \
                 vocab_size {} and tokenizer_config.json names no pad, eos or unk \
                 token; give --mask-token-id ID (or `mask_token_id` in the TOML file), e.g. \
                 an id the tokenizer does not use",
                dir.display(),
                target_config.vocab_size
            )
        })?,
        (None, None) => MaskToken {
            id: preset.mask_token_id,
            source: format!("preset:{}", preset.name),
            content: None,
        },
    })
}

/// A fresh drafter of `recipe.drafter_layers` layers and `recipe.block_size` slots.
fn fresh_drafter(
    target_config: &Qwen3Config,
    recipe: &Recipe,
    mask: MaskToken,
) -> Result<(DrafterSpec, String)> {
    if recipe.drafter_layers < 1 {
        bail!(
            "--drafter-layers must be at least 1 ({})",
            crate::engine::spec::in_config("drafter_layers")
        );
    }
    if !(2..=crate::telemetry::phase_recorder::MAX_SLOTS as i64).contains(&recipe.block_size) {
        bail!(
            "--block-size {} is out of range: use 2..={} ({})",
            recipe.block_size,
            crate::telemetry::phase_recorder::MAX_SLOTS,
            crate::engine::spec::in_config("block_size")
        );
    }
    let mut spec = drafter_spec_for(
        target_config,
        recipe.drafter_layers,
        mask.id,
        recipe.block_size,
    );
    if let Some(text) = mask.content {
        spec.mask_token = text;
    }
    Ok((spec, mask.source))
}
