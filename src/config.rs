//! The run configuration: a preset, then a TOML file, then command-line flags, validated into
//! one `RunConfig` (the engine's `PipelineSpec` and the viewer's settings) with errors that name
//! the flag or file and the fix.

use crate::config::cli::TrainArgs;
use crate::engine::spec::{DataSpec, PipelineSpec};
use crate::engine::train::schedule::Schedule;
use crate::telemetry::warnings::WarnConfig;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use tch::Device;

/// The lm-head chunk of the loss, MiB (rows x vocab x 4 bytes): 512 ran 1.2% faster than 1024
/// at 8B shapes and no slower at 0.6B (docs/performance.md).
pub const DEFAULT_LOSS_CHUNK_MIB: i64 = 512;

pub mod cli;
mod file;
mod flags;
mod model;
mod resume;
use file::fast_paths_of;
pub use file::{dwell_ns, FastPathsFile, FileConfig};
use flags::placed_devices;
pub use flags::{cuda_count, parse_devices, parse_slow, room_on};
use model::Model;
use resume::{check_data_position, resumed_schedule, run_seed};

/// A run as the command line and the TOML file give it: what the engine runs, and what its
/// watchers start with.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub pipeline: PipelineSpec,
    pub viewer: ViewerSettings,
}

/// What the run's watchers start with (the engine never reads these).
#[derive(Clone, Debug)]
pub struct ViewerSettings {
    pub record: Option<PathBuf>,
    /// Viewers the socket serves at once (`--max-viewers`).
    pub max_viewers: usize,
    /// Seconds between headless lines.
    pub interval: f64,
    pub gpu_timing: crate::telemetry::GpuTiming,
    /// Phase marks recorded from the start (`--profiling on|off`; `p` flips it live).
    pub profiling: bool,
    /// The warning rules' settings (the TOML's `[warnings]`).
    pub warnings: WarnConfig,
    /// Where flight-recorder dumps go (`--flight`, else `--save-dir`/flight; None: no dumps).
    pub flight: Option<PathBuf>,
    /// How long a verdict change must hold before it is shown, ns (TOML `verdict_dwell`, s).
    pub verdict_dwell_ns: u64,
}

/// `--gpu-timing` as given, else `events` when any worker is on CUDA (device time per phase
/// without stalls), else `async` (the modes mean nothing on the CPU).
fn gpu_timing_at_start(
    flag: Option<&str>,
    targets: &[Device],
    drafters: &[Device],
) -> Result<crate::telemetry::GpuTiming> {
    use crate::telemetry::GpuTiming;
    match flag {
        Some(name) => GpuTiming::parse(name)
            .with_context(|| format!("--gpu-timing `{name}`: use async, events or sync")),
        None if targets.iter().chain(drafters).any(|d| d.is_cuda()) => Ok(GpuTiming::Events),
        None => Ok(GpuTiming::Async),
    }
}

impl RunConfig {
    /// Applies what the configuration asks of this process before a run starts: CUPTI's
    /// subscription (`--cupti`), which loads a library. Reading the configuration (`from_args`)
    /// loads nothing.
    pub fn apply(mut self) -> Result<RunConfig> {
        self.pipeline.cupti = self.pipeline.cupti.apply()?;
        Ok(self)
    }

    /// Builds the configuration from flags (and the file they name); pure: no library loaded,
    /// nothing installed.
    pub fn from_args(args: &TrainArgs) -> Result<RunConfig> {
        let file = match &args.config {
            Some(p) => FileConfig::read(p)?,
            None => FileConfig::default(),
        };
        let model = Model::of(args, &file)?;
        let data = data_of(args, &file)?;
        let limits = Limits::of(args, &file)?;
        if let (Some(s), DataSpec::Synthetic) = (&model.resume_state, &data) {
            check_data_position(s, args.resume.as_deref())?;
        }
        let flop_ratio = crate::engine::model::flops::flop_ratio(
            &model.target_config,
            &model.drafter_spec,
            model.recipe.seq_len,
            model.recipe.anchors,
        );
        let devices = devices_of(args, &file, || flags::Estimate {
            ratio: flop_ratio,
            need: model.memory_need(),
        })?;
        let interval = args.interval.or(file.interval).unwrap_or(1.0);
        if !(interval > 0.0 && interval.is_finite()) {
            bail!("--interval must be a positive number of seconds");
        }
        let gpu_timing = gpu_timing_at_start(
            args.gpu_timing.as_deref().or(file.gpu_timing.as_deref()),
            &devices.0,
            &devices.1,
        )?;
        let flight = match &args.flight {
            Some(p) if p.as_os_str() == "off" => None,
            Some(p) => Some(p.clone()),
            None => limits.save_dir.as_ref().map(|d| d.join("flight")),
        };
        let max_viewers = limits.max_viewers;
        let pipeline = pipeline_spec(args, &file, model, data, limits, devices, flop_ratio)?;
        pipeline.validate()?;
        let viewer = ViewerSettings {
            record: args.record.clone(),
            max_viewers,
            interval,
            warnings: file.warnings.clone().unwrap_or_default(),
            flight,
            gpu_timing,
            profiling: match args.profiling.as_deref().or(file.profiling.as_deref()) {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => bail!("--profiling `{other}`: use on or off"),
            },
            verdict_dwell_ns: dwell_ns(file.verdict_dwell)?,
        };
        Ok(RunConfig { pipeline, viewer })
    }
}

/// `--data`: `synthetic` (the default) or a JSONL file that exists.
fn data_of(args: &TrainArgs, file: &FileConfig) -> Result<DataSpec> {
    Ok(match args.data.clone().or(file.data.clone()).as_deref() {
        None | Some("synthetic") => DataSpec::Synthetic,
        Some(p) => {
            let path = PathBuf::from(p);
            if !path.is_file() {
                bail!("--data {p}: no such file; give `synthetic` or a JSONL file");
            }
            DataSpec::Jsonl(path)
        }
    })
}

/// The run's counts and periods, each checked, and the save directory (prepared).
struct Limits {
    steps: Option<u64>,
    save_every: Option<u64>,
    save_dir: Option<PathBuf>,
    keep: Option<usize>,
    data_threads: Option<usize>,
    max_viewers: usize,
    max_nonfinite: u32,
}

impl Limits {
    fn of(args: &TrainArgs, file: &FileConfig) -> Result<Limits> {
        let steps = args.steps.or(file.steps);
        if steps == Some(0) {
            bail!("--steps 0 would train nothing: give a positive number or leave it out");
        }
        let save_every = args.save_every.or(file.save_every);
        if save_every == Some(0) {
            bail!("--save-every 0 is not a period: give a positive number of steps");
        }
        let save_dir = args.save_dir.clone().or(file.save_dir.clone());
        let keep = args.keep.or(file.keep);
        if keep == Some(0) {
            bail!("--keep 0 would delete every checkpoint: give at least 1 or leave it out");
        }
        if keep.is_some() && save_dir.is_none() {
            bail!("--keep needs --save-dir: say where checkpoints go");
        }
        let data_threads = args.data_threads.or(file.data_threads);
        if data_threads.is_some_and(|n| n > 64) {
            bail!("--data-threads must be 0 (the loader reads) to 64");
        }
        let max_viewers = args
            .max_viewers
            .or(file.max_viewers)
            .unwrap_or(crate::wire::serve::DEFAULT_MAX_VIEWERS);
        if max_viewers > crate::wire::serve::MAX_VIEWERS_LIMIT {
            bail!(
                "--max-viewers {max_viewers} is too many: give 0 (no viewers) to {}",
                crate::wire::serve::MAX_VIEWERS_LIMIT
            );
        }
        let max_nonfinite = args.max_nonfinite.or(file.max_nonfinite).unwrap_or(20);
        if max_nonfinite == 0 {
            bail!("--max-nonfinite 0 would stop at once: give at least 1 (the default is 20)");
        }
        if save_every.is_some() && save_dir.is_none() {
            bail!("--save-every needs --save-dir: say where checkpoints go");
        }
        if let Some(dir) = &save_dir {
            let notes = crate::engine::checkpoint::save_dir::prepare(
                dir,
                args.resume.is_some(),
                args.overwrite,
            )?;
            for n in notes {
                eprintln!("dflash-top: note: {n}");
            }
        }
        if file
            .threads_per_worker
            .is_some_and(|n| !(1..=256).contains(&n))
        {
            bail!("`threads_per_worker` must be 1 to 256 (libtorch threads per worker on the CPU)");
        }
        Ok(Limits {
            steps,
            save_every,
            save_dir,
            keep,
            data_threads,
            max_viewers,
            max_nonfinite,
        })
    }
}

/// The target and drafter devices: flags, else the TOML file, else the CPU; `all` for one role
/// with the other left out spreads both by the placement advice (`ratio`, from FLOPs).
fn devices_of(
    args: &TrainArgs,
    file: &FileConfig,
    estimate: impl FnOnce() -> flags::Estimate,
) -> Result<(Vec<Device>, Vec<Device>)> {
    let targets = args
        .target_devices
        .as_deref()
        .or(file.target_devices.as_deref());
    let drafters = args
        .drafter_devices
        .as_deref()
        .or(file.drafter_devices.as_deref());
    let (targets, drafters) = match (targets, drafters) {
        (Some("all"), None) | (None, Some("all")) => (Some("all"), Some("all")),
        other => other,
    };
    placed_devices(
        targets.unwrap_or("cpu"),
        drafters.unwrap_or("cpu"),
        estimate,
    )
}

/// `--cupti` (default `auto`), as asked for: nothing is loaded until `RunConfig::apply`
/// (src/engine/gpu/cupti.rs).
fn cupti_of(
    flag: Option<&str>,
    targets: &[Device],
    drafters: &[Device],
) -> Result<crate::engine::gpu::cupti::CuptiState> {
    use crate::engine::gpu::cupti::{CuptiState, Setting};
    let setting = match flag {
        None => Setting::Auto,
        Some(s) => {
            Setting::parse(s).with_context(|| format!("--cupti `{s}`: use auto, on or off"))?
        }
    };
    CuptiState::requested(setting, targets.iter().chain(drafters).any(|d| d.is_cuda()))
}

/// A `--target` run's recipe takes a step a document on a budget per document, which several
/// drafter replicas cannot (they step together; each one's batch holds its own count of
/// documents): with more than one, each of the two values the flags and the TOML file left to the
/// recipe comes from `Recipe::for_target_replicas` instead (6 steps a row, a budget per row), and
/// the config line says `recipe=target-replicas`. A resumed run keeps its checkpoint's.
fn recipe_for_replicas(
    args: &TrainArgs,
    file: &FileConfig,
    model: &Model,
    replicas: u32,
) -> (crate::engine::train::recipe::Recipe, String) {
    use crate::engine::train::recipe::Recipe;
    let mut recipe = model.recipe.clone();
    if replicas <= 1 || model.recipe_from != "target" || model.resume_state.is_some() {
        return (recipe, model.recipe_from.clone());
    }
    // Without a checkpoint, a value neither the flags nor the TOML file gave is the recipe's.
    let fallback = Recipe::for_target_replicas();
    let steps_left = args.steps_per_batch.or(file.steps_per_batch).is_none();
    let budget_left = args.anchor_budget.is_none() && file.anchor_budget.is_none();
    if steps_left {
        recipe.steps_per_batch = fallback.steps_per_batch;
    }
    if budget_left {
        recipe.anchor_scope = fallback.anchor_scope;
    }
    let from = if steps_left || budget_left {
        "target-replicas"
    } else {
        "target"
    };
    (recipe, from.into())
}

/// The engine's spec from the parts resolved above, and the rest of the flags and TOML keys:
/// the seed, the schedule, deliberate slowness, fast paths, queues and the job tag.
fn pipeline_spec(
    args: &TrainArgs,
    file: &FileConfig,
    model: Model,
    data: DataSpec,
    limits: Limits,
    (target_devices, drafter_devices): (Vec<Device>, Vec<Device>),
    flop_ratio: f64,
) -> Result<PipelineSpec> {
    let slow_items: Vec<String> = if args.slow.is_empty() {
        file.slow.clone().unwrap_or_default()
    } else {
        args.slow.clone()
    };
    let seed = run_seed(
        args.seed.or(file.seed),
        model.resume_state.as_ref(),
        args.resume.as_deref(),
    )?;
    let cupti = cupti_of(args.cupti.as_deref(), &target_devices, &drafter_devices)?;
    let job = crate::job::JobTag::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let replicas = drafter_devices.len() as u32 * job.as_ref().map_or(1, |j| j.world);
    let (recipe, recipe_from) = recipe_for_replicas(args, file, &model, replicas);
    if recipe.steps_per_batch == crate::engine::train::recipe::STEP_PER_DOC && replicas > 1 {
        let from = match (
            args.resume.as_deref(),
            args.steps_per_batch.or(file.steps_per_batch),
        ) {
            (Some(dir), None) => format!("the checkpoint {} trains", dir.display()),
            _ => "--steps-per-batch doc trains".into(),
        };
        anyhow::bail!(
            "{from} a step a document: drafter replicas step together, and each one's batch \
             holds its own count of documents; with {replicas} drafters give a count of steps a \
             batch (e.g. --steps-per-batch 6 --anchor-budget per-row)"
        );
    }
    Ok(PipelineSpec {
        target: model.target,
        target_config: model.target_config,
        target_precision: model.target_precision,
        optimizer_states: model.optimizer_states,
        drafter_spec: model.drafter_spec,
        recipe_from,
        mask_from: model.mask_from,
        drafter: model.drafter,
        data,
        steps: limits.steps,
        schedule: match &model.resume_state {
            Some(s) => resumed_schedule(s, limits.steps, model.lr_given, args.resume.as_deref())?,
            None => Schedule::for_steps(limits.steps),
        },
        resume_state: model.resume_state,
        save_dir: limits.save_dir,
        save_every: limits.save_every,
        resume: args.resume.clone(),
        target_devices,
        drafter_devices,
        seed,
        slow: parse_slow(&slow_items)?,
        batch: recipe.batch,
        seq_len: recipe.seq_len,
        anchors: recipe.anchors,
        anchor_scope: recipe.anchor_scope,
        steps_per_batch: recipe.steps_per_batch,
        lr: recipe.lr,
        batch_queue: file.batch_queue.unwrap_or(4),
        hs_queue: file.hs_queue.unwrap_or(2),
        threads_per_worker: file.threads_per_worker,
        loss_chunk_mib: file.loss_chunk_mib.unwrap_or(DEFAULT_LOSS_CHUNK_MIB),
        keep: limits.keep,
        max_nonfinite: limits.max_nonfinite,
        data_threads: limits.data_threads,
        chat: file.chat.clone().unwrap_or_default(),
        fast_paths: fast_paths_of(args.disable.as_deref(), file.fast_paths.as_ref())?,
        job,
        hooks: crate::engine::spec::ProcessHooks {
            stop_requested: crate::signals::requested,
            exit_now: crate::signals::exit_now,
        },
        cupti,
        flop_ratio,
        preset: model.preset,
    })
}

#[cfg(test)]
mod tests;
