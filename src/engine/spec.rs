//! The engine's own settings (`PipelineSpec`): everything a pipeline needs to run, resolved and
//! checked. The command-line and TOML layer builds one; nothing here knows flags or files.

use super::checkpoint;
use super::data::chat::ChatOptions;
use crate::engine::gpu::fast_paths::FastPaths;
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::model::memory::MemoryNeed;
use crate::engine::model::shapes::{DrafterSpec, Qwen3Config};
use crate::engine::train::blocks::AnchorScope;
use crate::engine::train::optim::moments::MomentPrecision;
use crate::engine::train::presets::Preset;
use crate::engine::train::schedule::Schedule;
use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use tch::Device;

/// The longest packed row a run takes: 64K tokens (reasoning data runs to 32K; the target's
/// attention is the part that grows faster than linear).
pub const MAX_SEQ_LEN: i64 = 65_536;

/// Deliberate slowness per stage, to show starvation (`--slow target=20ms`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slow {
    pub loader: Duration,
    pub target: Duration,
    pub drafter: Duration,
}

/// What the engine may ask of the process it runs in, without reaching up to the signals or
/// the screen: the config sets these from src/signals.rs.
#[derive(Clone, Copy, Debug)]
pub struct ProcessHooks {
    /// Whether the user asked to stop (a first signal): a long wait gives up.
    pub stop_requested: fn() -> bool,
    /// Exits at once, as a second signal does (terminal restored, nothing half written), after
    /// the message: for a run that cannot end by itself.
    pub exit_now: fn(i32, &str) -> !,
}

/// Where the documents come from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSpec {
    Synthetic,
    Jsonl(PathBuf),
}

/// What the engine runs, resolved: the models, the data, the recipe, the devices, where
/// checkpoints go. src/config.rs builds it from a preset, the TOML file and the flags; the engine
/// reads nothing else (what the run's watchers start with lives beside it, in the config).
#[derive(Clone, Debug)]
pub struct PipelineSpec {
    pub preset: Preset,
    pub target: Option<PathBuf>,
    /// The target's shapes: --target's config.json, or the preset's.
    pub target_config: Qwen3Config,
    /// How the target's linear layers compute (bf16, or FP8: src/engine/model/fp8.rs).
    pub target_precision: TargetPrecision,
    /// How the drafter's AdamW keeps its moments (src/engine/train/optim/moments.rs).
    pub optimizer_states: MomentPrecision,
    /// The drafter: read from --resume / --drafter, or a fresh one from the recipe.
    pub drafter_spec: DrafterSpec,
    /// Where the recipe came from: `preset:NAME` or `specforge` (a --target run).
    pub recipe_from: String,
    /// Where the drafter's mask token came from.
    pub mask_from: String,
    pub drafter: Option<PathBuf>,
    pub data: DataSpec,
    pub steps: Option<u64>,
    /// The lr schedule: cosine over --steps, or constant after warm-up without an end.
    pub schedule: Schedule,
    pub save_dir: Option<PathBuf>,
    pub save_every: Option<u64>,
    pub resume: Option<PathBuf>,
    /// The trainer state of --resume: step, schedule, data position, sampler state.
    pub resume_state: Option<checkpoint::TrainerState>,
    pub target_devices: Vec<Device>,
    pub drafter_devices: Vec<Device>,
    pub seed: u64,
    pub slow: Slow,
    pub batch: i64,
    pub seq_len: i64,
    pub anchors: i64,
    pub anchor_scope: AnchorScope,
    pub steps_per_batch: i64,
    pub lr: f64,
    pub batch_queue: usize,
    pub hs_queue: usize,
    /// libtorch intra-op threads per worker (CPU); None = cores / workers.
    pub threads_per_worker: Option<i32>,
    /// Lm-head chunk in the loss, MiB: rows x vocab x 4 bytes (bf16 logits and probabilities).
    pub loss_chunk_mib: i64,
    /// Newest `step-*` checkpoints kept in save_dir (None: all).
    pub keep: Option<usize>,
    /// Steps in a row with a non-finite loss or gradient before the run stops.
    pub max_nonfinite: u32,
    /// Threads reading a JSONL file ahead of the loader (None: the default for this machine).
    pub data_threads: Option<usize>,
    /// How chat data is rendered (the TOML's `[chat]`: `enable_thinking`, `system_prompt`).
    pub chat: ChatOptions,
    /// The fast paths turned off for a side-by-side run (`--disable`, `[fast_paths]`).
    pub fast_paths: FastPaths,
    /// This process's place in a multi-process job (torchrun's variables), None for a plain run.
    pub job: Option<crate::job::JobTag>,
    /// The process's signals, as the engine may use them (a job's waits and forced exit).
    pub hooks: ProcessHooks,
    /// Whether CUPTI counts the CUDA workers' launches and syncs (`--cupti`: as asked for,
    /// then as `RunConfig::apply` applied it).
    pub cupti: crate::engine::gpu::cupti::CuptiState,
    /// The drafter stage's FLOPs a batch over the target's (src/engine/model/flops.rs), computed
    /// once: the placement advice's estimate until steps are measured.
    pub flop_ratio: f64,
}

impl PipelineSpec {
    /// What a target and a drafter of this run hold on a GPU (src/engine/model/memory.rs).
    pub fn memory_need(&self) -> MemoryNeed {
        self.memory_need_with(self.target_precision, self.optimizer_states)
    }

    /// The same with the target's precision and the AdamW moments' set otherwise.
    fn memory_need_with(&self, target: TargetPrecision, moments: MomentPrecision) -> MemoryNeed {
        crate::engine::model::memory::need(
            &self.target_config,
            target,
            moments.bytes(),
            &self.drafter_spec,
            self.seq_len,
            self.anchors,
            self.batch,
        )
    }

    /// Whether a target and whether a drafter train on the CPU.
    fn on_cpu(&self) -> (bool, bool) {
        let cpu = |devices: &[Device]| devices.contains(&Device::Cpu);
        (cpu(&self.target_devices), cpu(&self.drafter_devices))
    }

    /// Where the target or the drafter trains on the CPU: what their weights alone take in host
    /// memory (src/engine/model/memory.rs `host_weights_gib`); None where both are on GPUs.
    pub fn host_weights_gib(&self) -> Option<f64> {
        let (target, drafter) = self.on_cpu();
        (target || drafter).then(|| {
            crate::engine::model::memory::host_weights_gib(
                &self.target_config,
                self.target_precision,
                self.optimizer_states.bytes(),
                &self.drafter_spec,
                target,
                drafter,
            )
        })
    }

    /// Refused before anything is built where the weights of a side on the CPU
    /// (`host_weights_gib`) are more than the host's `available_gib`. The sentence says what takes
    /// it and what to do (the kernel would otherwise kill the process mid-build, a terminal left
    /// raw). A `--target`'s checkpoint does not count: it is read a tensor at a time
    /// (src/engine/model/tensor_file.rs).
    pub fn host_memory_refusal(&self, available_gib: f64) -> Option<String> {
        let need = self.host_weights_gib()?;
        if need <= available_gib {
            return None;
        }
        let model = match &self.target {
            Some(dir) => format!("--target {}", dir.display()),
            None => format!("--preset {}", self.preset.name),
        };
        let sides = match self.on_cpu() {
            (true, true) => "the target and the drafter",
            (true, false) => "the target",
            _ => "the drafter",
        };
        let fix = if self.target.is_some() {
            "train it on GPUs (--target-devices cuda:0 --drafter-devices cuda:0) or on a machine \
             with more memory"
        } else {
            "train it on GPUs (--target-devices cuda:0 --drafter-devices cuda:0) or pick a smaller \
             --preset (tiny, qwen3-0.6b)"
        };
        Some(format!(
            "{model} with {sides} on the CPU needs at least {need:.1} GiB of host memory (the \
             weights on the CPU, f32 there), and this machine has {available_gib:.1} GiB available \
             (free memory and swap, within its cgroup's limit); {fix}"
        ))
    }

    /// Whether a target and a drafter share a GPU.
    pub fn shares_a_gpu(&self) -> bool {
        self.target_devices
            .iter()
            .any(|d| self.drafter_devices.contains(d))
    }

    /// The memory levers this run has not set, in the order we suggest them (bf16 AdamW moments,
    /// then an FP8 target where `fp8` says the GPUs run FP8 GEMMs, then both), each with its
    /// flags and what the run would need with it.
    pub fn memory_levers(&self, fp8: bool) -> Vec<(&'static str, MemoryNeed)> {
        use MomentPrecision::Bf16;
        let moments = self.optimizer_states != Bf16;
        let target = fp8 && self.target_precision != TargetPrecision::Fp8;
        let mut levers = Vec::new();
        if moments {
            let need = self.memory_need_with(self.target_precision, Bf16);
            levers.push(("--optimizer-states bf16", need));
        }
        if target {
            let need = self.memory_need_with(TargetPrecision::Fp8, self.optimizer_states);
            levers.push(("--target-precision fp8", need));
        }
        if moments && target {
            let need = self.memory_need_with(TargetPrecision::Fp8, Bf16);
            levers.push(("--target-precision fp8 --optimizer-states bf16", need));
        }
        levers
    }

    /// For libtorch's out-of-memory on GPUs of `card_gib` (the smallest the run uses; None on the
    /// CPU): what the shapes need against it and the memory levers this run has not set
    /// (`memory_levers`): the first that fits with 3% to spare and what the run would need with
    /// it, or where none fits what it would need even with all of them. On the CPU, with no card
    /// to fit, the first lever. A lever that saves less than a rounded GiB is not offered.
    pub fn memory_note(&self, card_gib: Option<f64>, fp8: bool) -> String {
        let shared = self.shares_a_gpu();
        let gib = |n: &MemoryNeed| match shared {
            true => n.together_gib(),
            false => n.apart_gib(),
        };
        let who = match shared {
            true => "a target and a drafter together need",
            false => "the larger of a target and a drafter needs",
        };
        let now = gib(&self.memory_need());
        let mut note = format!("by the shapes {who} about {now:.0} GiB");
        // A lever that saves less than the note's rounding is not offered.
        let levers: Vec<_> = self
            .memory_levers(fp8)
            .into_iter()
            .filter(|(_, n)| gib(n).round() < now.round())
            .collect();
        let said = match card_gib {
            None => levers.first().map(|lever| ("with", lever)),
            Some(card_gib) => {
                note.push_str(&format!(", the GPU holds {card_gib:.0} GiB"));
                match levers.iter().find(|(_, n)| gib(n) < 0.97 * card_gib) {
                    Some(lever) => Some(("with", lever)),
                    None => levers.last().map(|lever| ("even with", lever)),
                }
            }
        };
        if let Some((how, (flags, need))) = said {
            note.push_str(&format!("; {how} {flags} about {:.0} GiB", gib(need)));
        }
        note
    }

    pub fn validate(&self) -> Result<()> {
        if self.batch < 1 {
            bail!("--batch must be at least 1 ({})", in_config("batch"));
        }
        if !(32..=MAX_SEQ_LEN).contains(&self.seq_len) {
            bail!(
                "--seq-len {} is out of range: use 32..={MAX_SEQ_LEN} ({})",
                self.seq_len,
                in_config("seq_len")
            );
        }
        if self.anchors < 1 || self.anchors > 512 {
            bail!(
                "--anchors {} is out of range: use 1..=512 ({})",
                self.anchors,
                in_config("anchors")
            );
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            bail!("--lr must be a positive number ({})", in_config("lr"));
        }
        if !(16..=65536).contains(&self.loss_chunk_mib) {
            bail!(
                "`loss_chunk_mib` {} is out of range: use 16..=65536",
                self.loss_chunk_mib
            );
        }
        if self.batch_queue == 0 || self.hs_queue == 0 {
            bail!("queue depths (`batch_queue`, `hs_queue`) must be at least 1");
        }
        if let Some(d) = self.drafter.as_ref().filter(|d| !d.is_dir()) {
            bail!(
                "--drafter {}: no such directory; give a drafter checkpoint directory",
                d.display()
            );
        }
        Ok(())
    }

    /// The target as the config line names it: its directory, or `preset:NAME`.
    pub fn target_label(&self) -> String {
        match &self.target {
            Some(d) => d.display().to_string(),
            None => format!("preset:{}", self.preset.name),
        }
    }

    /// The resolved recipe as one `config: key=value ...` line (headless prints it at start;
    /// the TUI can show it).
    pub fn recipe_line(&self) -> String {
        let s = &self.drafter_spec;
        let target = self.target_label();
        let data = match &self.data {
            DataSpec::Synthetic => "synthetic".to_string(),
            DataSpec::Jsonl(p) => p.display().to_string(),
        };
        let ids: Vec<String> = s.target_layer_ids.iter().map(|i| i.to_string()).collect();
        format!(
            "config: recipe={} target={} target_precision={} optimizer_states={} hidden={} target_layers={} drafter_layers={} \
             target_layer_ids={} block={} mask_token_id={} mask_from={} seq_len={} batch={} \
             anchors={} anchor_budget={} steps_per_batch={} lr={:e} schedule={} grad_clip=1.0 init=normal(0.02) steps={} \
             seed={} data={} cupti={} fast_paths={}",
            self.recipe_from,
            target,
            self.target_precision.name(),
            self.optimizer_states.name(),
            s.layers.hidden_size,
            s.num_target_layers,
            s.layers.num_hidden_layers,
            ids.join(","),
            s.block_size,
            s.mask_token_id,
            self.mask_from,
            self.seq_len,
            self.batch,
            self.anchors,
            self.anchor_scope.name(),
            crate::engine::train::recipe::steps_per_batch_name(self.steps_per_batch),
            self.lr,
            self.schedule.describe(),
            self.steps
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            self.seed,
            data,
            self.cupti.field(),
            self.fast_paths.describe(),
        )
    }
}

/// The fields of a `config: k=v k=v ...` line (`PipelineSpec::recipe_line`), in order; a value
/// with spaces (a path) keeps them: a token without `=` belongs to the field before it.
pub fn config_fields(line: &str) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = Vec::new();
    for token in line.trim_start_matches("config:").split_whitespace() {
        match token.split_once('=') {
            Some((k, v)) => fields.push((k.to_string(), v.to_string())),
            None => {
                if let Some((_, v)) = fields.last_mut() {
                    v.push(' ');
                    v.push_str(token);
                }
            }
        }
    }
    fields
}

/// What a run trains, from its `config:` line, for the TUI's header: the target's name (a
/// preset's, or its directory's last component) and, where they are not the defaults, the
/// target's precision and the AdamW moments' (`qwen3-32b · target fp8 · moments bf16`). None
/// for a line without a target.
pub fn model_label(line: &str) -> Option<String> {
    let fields = config_fields(line);
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let target = field("target")?;
    let name = match target.strip_prefix("preset:") {
        Some(preset) => preset,
        None => std::path::Path::new(target)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(target),
    };
    let mut label = name.to_string();
    if let Some(p) = field("target_precision").filter(|p| *p != "bf16") {
        label.push_str(&format!(" · target {p}"));
    }
    if let Some(m) = field("optimizer_states").filter(|m| *m != "f32") {
        label.push_str(&format!(" · moments {m}"));
    }
    Some(label)
}

/// Where a training setting sits in a `--config` file, for an error that names the flag first.
pub(crate) fn in_config(key: &str) -> String {
    format!("`{key}` in a --config file")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_lines_split_into_fields_keeping_spaces_in_a_value() {
        let f = config_fields("config: recipe=preset:tiny lr=6e-4 data=/a b/c.jsonl seed=1");
        assert_eq!(
            f,
            vec![
                ("recipe".into(), "preset:tiny".into()),
                ("lr".into(), "6e-4".into()),
                ("data".into(), "/a b/c.jsonl".into()),
                ("seed".into(), "1".into())
            ]
        );
    }

    /// The target's name and only the precisions set off their defaults; a target directory
    /// with a space in its path named whole; a line without a target, nothing.
    #[test]
    fn the_model_label_names_the_target_and_what_is_off_default() {
        let line = "config: recipe=preset:qwen3-32b target=preset:qwen3-32b target_precision=fp8 \
                    optimizer_states=bf16 hidden=5120";
        assert_eq!(
            model_label(line).as_deref(),
            Some("qwen3-32b · target fp8 · moments bf16")
        );
        let line = "config: recipe=target target=/models/Qwen3-8B target_precision=bf16 \
                    optimizer_states=f32";
        assert_eq!(model_label(line).as_deref(), Some("Qwen3-8B"));
        let line = "config: recipe=target target=/my models/Qwen3 8B target_precision=bf16";
        assert_eq!(model_label(line).as_deref(), Some("Qwen3 8B"));
        assert_eq!(model_label("config: recipe=target seed=3"), None);
    }
}
