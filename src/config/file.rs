//! The TOML run configuration as a file: its keys (every one optional, an unknown one refused),
//! reading it with the line at fault in the error, and the checks of its small values
//! (`[fast_paths]`, `verdict_dwell`).

use crate::engine::data::chat::ChatOptions;
use crate::engine::gpu::fast_paths::FastPaths;
use crate::telemetry::warnings::WarnConfig;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// The TOML file: every key optional, unknown keys refused (a typo is an error, not a no-op).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub preset: Option<String>,
    pub target: Option<PathBuf>,
    /// `bf16` or `fp8` (`--target-precision`).
    pub target_precision: Option<String>,
    /// `f32` or `bf16` (`--optimizer-states`).
    pub optimizer_states: Option<String>,
    pub drafter: Option<PathBuf>,
    pub data: Option<String>,
    pub steps: Option<u64>,
    pub save_dir: Option<PathBuf>,
    pub save_every: Option<u64>,
    pub target_devices: Option<String>,
    pub drafter_devices: Option<String>,
    pub seed: Option<u64>,
    pub batch: Option<i64>,
    pub seq_len: Option<i64>,
    pub anchors: Option<i64>,
    pub anchor_budget: Option<String>,
    /// A count or "doc" (`--steps-per-batch`).
    #[serde(default, deserialize_with = "steps_per_batch_of")]
    pub steps_per_batch: Option<i64>,
    pub lr: Option<f64>,
    pub batch_queue: Option<usize>,
    pub hs_queue: Option<usize>,
    pub threads_per_worker: Option<i32>,
    pub slow: Option<Vec<String>>,
    pub interval: Option<f64>,
    pub gpu_timing: Option<String>,
    pub profiling: Option<String>,
    pub loss_chunk_mib: Option<i64>,
    pub drafter_layers: Option<i64>,
    pub block_size: Option<i64>,
    pub mask_token_id: Option<i64>,
    pub keep: Option<usize>,
    pub max_nonfinite: Option<u32>,
    pub data_threads: Option<usize>,
    /// `[chat]`: `enable_thinking` and `system_prompt` for chat data.
    pub chat: Option<ChatOptions>,
    pub max_viewers: Option<usize>,
    /// `[warnings]`: the warning rules' thresholds, rules switched off, severities.
    pub warnings: Option<WarnConfig>,
    /// Seconds a verdict change must hold before it is shown (default 3).
    pub verdict_dwell: Option<f64>,
    /// `[fast_paths]`: `disable` (names), `window_groups` and `tile_anchors`.
    pub fast_paths: Option<FastPathsFile>,
}

/// The TOML's `[fast_paths]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FastPathsFile {
    /// Paths turned off: `["graphs", "fused-adamw"]`.
    #[serde(default)]
    pub disable: Vec<String>,
    /// Runs of tiles a layer in the drafter's tiled attention, 1 to 64.
    pub window_groups: Option<i64>,
    /// Anchors a tile of the drafter's tiled attention holds at most, 1 to 128.
    pub tile_anchors: Option<i64>,
}

/// `--disable` (which replaces the TOML's list) and `[fast_paths]`, checked.
pub(super) fn fast_paths_of(flag: Option<&str>, file: Option<&FastPathsFile>) -> Result<FastPaths> {
    let file = file.cloned().unwrap_or_default();
    let mut paths = match flag {
        Some(list) => FastPaths::disabling(list.split(','), "--disable")?,
        None => FastPaths::disabling(
            file.disable.iter().map(String::as_str),
            "`disable` in [fast_paths]",
        )?,
    };
    if let Some(n) = file.window_groups {
        if !(1..=64).contains(&n) {
            bail!("`window_groups` {n} in [fast_paths] is out of range: use 1 to 64");
        }
        paths.window_groups = n;
    }
    if let Some(n) = file.tile_anchors {
        if !(1..=128).contains(&n) {
            bail!("`tile_anchors` {n} in [fast_paths] is out of range: use 1 to 128");
        }
        paths.tile_anchors = n;
    }
    Ok(paths)
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read config file {}: check --config", path.display())
        })?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| {
            // The line at fault, for messages that do not name the key ("invalid type").
            let at = e
                .span()
                .map(|r| {
                    let line = text[..r.start.min(text.len())].lines().count().max(1);
                    let shown = text.lines().nth(line - 1).unwrap_or("").trim();
                    format!(" (line {line}: `{shown}`)")
                })
                .unwrap_or_default();
            anyhow::anyhow!(
                "config file {} is not valid: {}{at}",
                path.display(),
                e.message()
            )
        })?;
        if let Some(w) = &file.warnings {
            w.check()
                .map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        }
        Ok(file)
    }
}

/// The TOML's `verdict_dwell` (seconds) in ns, checked; the default where it is not set.
pub fn dwell_ns(seconds: Option<f64>) -> Result<u64> {
    match seconds {
        None => Ok(crate::telemetry::verdict::DWELL_NS),
        Some(s) if (0.0..=600.0).contains(&s) => Ok((s * 1e9) as u64),
        Some(s) => {
            bail!("`verdict_dwell` {s} in the TOML: give seconds from 0 (change at once) to 600")
        }
    }
}

/// `steps_per_batch = 3` or `steps_per_batch = "doc"`.
fn steps_per_batch_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Given {
        Count(i64),
        Name(String),
    }
    let text = match Given::deserialize(d)? {
        Given::Count(n) => n.to_string(),
        Given::Name(s) => s,
    };
    crate::engine::train::recipe::parse_steps_per_batch(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("`steps_per_batch` {e}")))
}
