//! The run configuration: a preset, then a TOML file, then command-line flags, validated into
//! one `RunConfig` with errors that name the flag or file and the fix.

use crate::cli::TrainArgs;
use crate::engine::config::Preset;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tch::Device;

#[derive(Clone, Debug, PartialEq)]
pub enum DataSpec {
    Synthetic,
    Jsonl(PathBuf),
}

/// Deliberate slowness per stage, to show starvation (`--slow target=20ms`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slow {
    pub loader: Duration,
    pub target: Duration,
    pub drafter: Duration,
}

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub preset: Preset,
    pub target: Option<PathBuf>,
    pub drafter: Option<PathBuf>,
    pub data: DataSpec,
    pub steps: Option<u64>,
    /// Horizon of the lr schedule when --steps is not given.
    pub schedule_steps: u64,
    pub save_dir: Option<PathBuf>,
    pub save_every: Option<u64>,
    pub resume: Option<PathBuf>,
    pub target_devices: Vec<Device>,
    pub drafter_devices: Vec<Device>,
    pub record: Option<PathBuf>,
    pub seed: u64,
    pub slow: Slow,
    pub interval: f64,
    pub batch: i64,
    pub seq_len: i64,
    pub anchors: i64,
    pub lr: f64,
    pub batch_queue: usize,
    pub hs_queue: usize,
    /// libtorch intra-op threads per worker (CPU); None = cores / workers.
    pub threads_per_worker: Option<i32>,
    pub gpu_timing: crate::telemetry::GpuTiming,
    /// Phase marks recorded from the start (`--profiling on|off`; `p` flips it live).
    pub profiling: bool,
    /// f32 logits per lm-head chunk in the loss, MiB.
    pub loss_chunk_mib: i64,
    /// Newest `step-*` checkpoints kept in save_dir (None: all).
    pub keep: Option<usize>,
    /// Steps in a row with a non-finite loss or gradient before the run stops.
    pub max_nonfinite: u32,
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

/// The TOML file: every key optional, unknown keys refused (a typo is an error, not a no-op).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub preset: Option<String>,
    pub target: Option<PathBuf>,
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
    pub lr: Option<f64>,
    pub batch_queue: Option<usize>,
    pub hs_queue: Option<usize>,
    pub threads_per_worker: Option<i32>,
    pub slow: Option<Vec<String>>,
    pub interval: Option<f64>,
    pub gpu_timing: Option<String>,
    pub profiling: Option<String>,
    pub loss_chunk_mib: Option<i64>,
    pub keep: Option<usize>,
    pub max_nonfinite: Option<u32>,
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read config file {}: check --config", path.display())
        })?;
        toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "config file {} is not valid: {}",
                path.display(),
                e.message()
            )
        })
    }
}

/// Parses `cpu`, `cuda`, `cuda:N`, comma-separated; checks that each device exists.
pub fn parse_devices(list: &str, flag: &str) -> Result<Vec<Device>> {
    let cuda_count = || {
        if tch::Cuda::is_available() {
            tch::Cuda::device_count()
        } else {
            0
        }
    };
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let dev = match item {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            s if s.starts_with("cuda:") => {
                let n: usize = s[5..]
                    .parse()
                    .with_context(|| format!("{flag}: `{s}` is not a device: use cpu or cuda:N"))?;
                Device::Cuda(n)
            }
            s => bail!("{flag}: `{s}` is not a device: use cpu or cuda:N"),
        };
        if let Device::Cuda(n) = dev {
            let count = cuda_count();
            if n as i64 >= count {
                bail!(
                    "{flag}: device cuda:{n} does not exist (this machine has {count} CUDA \
                     device(s)); use cpu{}",
                    if count > 0 {
                        format!(" or cuda:0..cuda:{}", count - 1)
                    } else {
                        String::new()
                    }
                );
            }
        }
        out.push(dev);
    }
    if out.is_empty() {
        bail!("{flag} is empty: give at least one device, e.g. cpu or cuda:0");
    }
    Ok(out)
}

/// Parses `stage=duration` (`target=20ms`, `drafter=0.5s`).
pub fn parse_slow(items: &[String]) -> Result<Slow> {
    let mut slow = Slow::default();
    for item in items {
        let (stage, dur) = item
            .split_once('=')
            .with_context(|| format!("--slow `{item}`: use STAGE=DURATION, e.g. target=20ms"))?;
        let d = parse_duration(dur).with_context(|| {
            format!("--slow `{item}`: `{dur}` is not a duration like 20ms or 0.5s")
        })?;
        match stage {
            "loader" => slow.loader = d,
            "target" => slow.target = d,
            "drafter" => slow.drafter = d,
            s => bail!("--slow `{item}`: unknown stage `{s}`: use loader, target or drafter"),
        }
    }
    Ok(slow)
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else {
        return None;
    };
    let v: f64 = num.trim().parse().ok()?;
    (v >= 0.0 && v.is_finite()).then(|| Duration::from_secs_f64(v * scale))
}

impl RunConfig {
    /// Builds the configuration from flags (and the file they name).
    pub fn from_args(args: &TrainArgs) -> Result<RunConfig> {
        let file = match &args.config {
            Some(p) => FileConfig::read(p)?,
            None => FileConfig::default(),
        };
        let preset_name = args
            .preset
            .clone()
            .or(file.preset.clone())
            .unwrap_or_else(|| "tiny".into());
        let preset = Preset::by_name(&preset_name)?;
        let data = match args.data.clone().or(file.data.clone()).as_deref() {
            None | Some("synthetic") => DataSpec::Synthetic,
            Some(p) => {
                let path = PathBuf::from(p);
                if !path.is_file() {
                    bail!("--data {p}: no such file; give `synthetic` or a JSONL file");
                }
                DataSpec::Jsonl(path)
            }
        };
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
        let max_nonfinite = args.max_nonfinite.or(file.max_nonfinite).unwrap_or(20);
        if max_nonfinite == 0 {
            bail!("--max-nonfinite 0 would stop at once: give at least 1 (the default is 20)");
        }
        if save_every.is_some() && save_dir.is_none() {
            bail!("--save-every needs --save-dir: say where checkpoints go");
        }
        let target_devices = parse_devices(
            args.target_devices
                .as_deref()
                .or(file.target_devices.as_deref())
                .unwrap_or("cpu"),
            "--target-devices",
        )?;
        let drafter_devices = parse_devices(
            args.drafter_devices
                .as_deref()
                .or(file.drafter_devices.as_deref())
                .unwrap_or("cpu"),
            "--drafter-devices",
        )?;
        let slow_items: Vec<String> = if args.slow.is_empty() {
            file.slow.clone().unwrap_or_default()
        } else {
            args.slow.clone()
        };
        let interval = args.interval.or(file.interval).unwrap_or(1.0);
        if !(interval > 0.0 && interval.is_finite()) {
            bail!("--interval must be a positive number of seconds");
        }
        let gpu_timing = gpu_timing_at_start(
            args.gpu_timing.as_deref().or(file.gpu_timing.as_deref()),
            &target_devices,
            &drafter_devices,
        )?;
        let cfg = RunConfig {
            target: args.target.clone().or(file.target.clone()),
            drafter: args.drafter.clone().or(file.drafter.clone()),
            data,
            steps,
            schedule_steps: steps.unwrap_or(10_000),
            save_dir,
            save_every,
            resume: args.resume.clone(),
            target_devices,
            drafter_devices,
            record: args.record.clone(),
            seed: args.seed.or(file.seed).unwrap_or(0),
            slow: parse_slow(&slow_items)?,
            interval,
            batch: file.batch.unwrap_or(preset.batch),
            seq_len: file.seq_len.unwrap_or(preset.seq_len),
            anchors: file.anchors.unwrap_or(preset.anchors),
            lr: file.lr.unwrap_or(preset.lr),
            batch_queue: file.batch_queue.unwrap_or(4),
            hs_queue: file.hs_queue.unwrap_or(2),
            threads_per_worker: file.threads_per_worker,
            loss_chunk_mib: file.loss_chunk_mib.unwrap_or(1024),
            keep,
            max_nonfinite,
            gpu_timing,
            profiling: match args.profiling.as_deref().or(file.profiling.as_deref()) {
                None | Some("on") => true,
                Some("off") => false,
                Some(other) => bail!("--profiling `{other}`: use on or off"),
            },
            preset,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if self.batch < 1 {
            bail!("`batch` must be at least 1");
        }
        if self.seq_len < 32 || self.seq_len > 3072 {
            bail!("`seq_len` {} is out of range: use 32..=3072", self.seq_len);
        }
        if self.anchors < 1 || self.anchors > 512 {
            bail!("`anchors` {} is out of range: use 1..=512", self.anchors);
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) {
            bail!("`lr` must be a positive number");
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
        if let Some(d) = &self.target {
            if !d.is_dir() {
                bail!(
                    "--target {}: no such directory; give a Hugging Face Qwen3 directory",
                    d.display()
                );
            }
        }
        for (flag, d) in [("--drafter", &self.drafter), ("--resume", &self.resume)] {
            if let Some(d) = d {
                if !d.is_dir() {
                    bail!(
                        "{flag} {}: no such directory; give a drafter checkpoint directory",
                        d.display()
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_specs_parse_and_bad_ones_say_why() {
        let s = parse_slow(&["target=20ms".into(), "drafter=0.5s".into()]).unwrap();
        assert_eq!(s.target, Duration::from_millis(20));
        assert_eq!(s.drafter, Duration::from_millis(500));
        assert!(parse_slow(&["gpu=1ms".into()])
            .unwrap_err()
            .to_string()
            .contains("unknown stage"));
        assert!(parse_slow(&["target=fast".into()])
            .unwrap_err()
            .to_string()
            .contains("duration"));
    }

    #[test]
    fn devices_parse_and_missing_ones_are_refused() {
        assert_eq!(parse_devices("cpu", "--x").unwrap(), vec![Device::Cpu]);
        let e = parse_devices("cuda:7", "--drafter-devices")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--drafter-devices") && e.contains("cuda:7"),
            "{e}"
        );
        assert!(parse_devices("tpu", "--x").is_err());
    }
}
