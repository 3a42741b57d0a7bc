//! Parsers of the flags whose values are small languages: device lists (`cpu`, `cuda:N`, `all`)
//! and deliberate slowness (`--slow target=20ms`), each error naming the flag and the fix.

use crate::engine::model::memory::MemoryNeed;
use crate::engine::spec::Slow;
use crate::telemetry::placement::Room;
use anyhow::{bail, Context, Result};
use std::time::Duration;
use tch::Device;

/// The CUDA devices this process sees (0 without CUDA).
pub fn cuda_count() -> i64 {
    if tch::Cuda::is_available() {
        tch::Cuda::device_count()
    } else {
        0
    }
}

/// What the placement advice weighs: the drafter's cost per batch over the target's (from
/// FLOPs) and the GiB of a target and a drafter together and apart (src/engine/model/memory.rs).
pub(super) struct Estimate {
    pub ratio: f64,
    pub need: MemoryNeed,
}

/// What a target and a drafter need against the smallest of `gpus` cards (none where a card's
/// size cannot be read).
pub fn room_on(gpus: usize, need: &MemoryNeed) -> Option<Room> {
    let card = (0..gpus)
        .map(crate::cuda_shim::memory_total)
        .collect::<Result<Vec<u64>>>()
        .ok()?
        .into_iter()
        .min()?;
    Some(Room {
        together_gib: need.together_gib(),
        apart_gib: need.apart_gib(),
        card_gib: card as f64 / (1u64 << 30) as f64,
    })
}

/// --target-devices and --drafter-devices; `all` spreads that role over every GPU by the
/// placement advice (the stages' cost ratio, and whether a target and a drafter fit one card
/// together), or gives it every GPU when the other role is listed.
pub(super) fn placed_devices(
    targets: &str,
    drafters: &str,
    estimate: impl FnOnce() -> Estimate,
) -> Result<(Vec<Device>, Vec<Device>)> {
    let (t_all, d_all) = (targets.trim() == "all", drafters.trim() == "all");
    if !t_all && !d_all {
        return Ok((
            parse_devices(targets, "--target-devices")?,
            parse_devices(drafters, "--drafter-devices")?,
        ));
    }
    let gpus = cuda_count() as usize;
    if gpus == 0 {
        let flag = if t_all {
            "--target-devices"
        } else {
            "--drafter-devices"
        };
        bail!("{flag} all: this machine has no CUDA device; use cpu");
    }
    let every = || (0..gpus).map(Device::Cuda).collect::<Vec<_>>();
    Ok(match (t_all, d_all) {
        (true, true) => {
            let e = estimate();
            let room = room_on(gpus, &e.need);
            let (t, d) = crate::telemetry::placement::advise_in(e.ratio, gpus, room).devices();
            (
                t.into_iter().map(Device::Cuda).collect(),
                d.into_iter().map(Device::Cuda).collect(),
            )
        }
        (true, false) => (every(), parse_devices(drafters, "--drafter-devices")?),
        _ => (parse_devices(targets, "--target-devices")?, every()),
    })
}

/// Parses `cpu`, `cuda`, `cuda:N`, `cuda:local` (the GPU of this process's LOCAL_RANK, as
/// torchrun sets it), comma-separated; checks that each device exists.
pub fn parse_devices(list: &str, flag: &str) -> Result<Vec<Device>> {
    let mut out = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let dev = match item {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda(0),
            "cuda:local" => Device::Cuda(local_rank(flag)?),
            s if s.starts_with("cuda:") => {
                let n: usize = s[5..]
                    .parse()
                    .with_context(|| format!("{flag}: `{s}` is not a device: use cpu or cuda:N"))?;
                Device::Cuda(n)
            }
            s => bail!("{flag}: `{s}` is not a device: use cpu, cuda:N or all"),
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

/// LOCAL_RANK (0 when unset): which GPU of the host `cuda:local` is.
fn local_rank(flag: &str) -> Result<usize> {
    match std::env::var("LOCAL_RANK") {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            anyhow::anyhow!(
                "{flag}: cuda:local reads LOCAL_RANK, which is {v:?}, not a whole number: set it as torchrun does"
            )
        }),
    }
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

    /// A target directory with tiny's config.json and, optionally, a tokenizer.json of `n` ids.
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

    #[test]
    fn all_devices_follow_the_advice_or_say_there_is_no_gpu() {
        let gpus = cuda_count() as usize;
        // Small models: room on any card, so the rate alone decides.
        let need = |gib| MemoryNeed {
            target_gib: gib,
            target_load_gib: gib,
            drafter_gib: gib,
            shared_gib: 0.0,
        };
        let small = |ratio| {
            move || Estimate {
                ratio,
                need: need(0.5),
            }
        };
        let placed = placed_devices("all", "all", small(3.1));
        if gpus == 0 {
            let e = placed.unwrap_err().to_string();
            assert!(
                e.contains("--target-devices all") && e.contains("no CUDA device"),
                "{e}"
            );
            assert!(placed_devices("cpu", "all", small(1.0)).is_err());
            return;
        }
        let (t, d) = placed.unwrap();
        let (want_t, want_d) = crate::telemetry::placement::advise(3.1, gpus).devices();
        assert_eq!(t, want_t.into_iter().map(Device::Cuda).collect::<Vec<_>>());
        assert_eq!(d, want_d.into_iter().map(Device::Cuda).collect::<Vec<_>>());
        let (t, d) = placed_devices("cuda:0", "all", small(1.0)).unwrap();
        assert_eq!(
            (t.len(), d.len()),
            (1, gpus),
            "the listed role as given, the other on every GPU"
        );
        // Too big to share any card: on 2 or more GPUs, the roles get cards of their own.
        if gpus >= 2 {
            let big = || Estimate {
                ratio: 2.0,
                need: MemoryNeed {
                    target_gib: 1e4,
                    target_load_gib: 1e4,
                    drafter_gib: 1.0,
                    shared_gib: 0.0,
                },
            };
            let (t, d) = placed_devices("all", "all", big).unwrap();
            assert!(t.iter().all(|x| !d.contains(x)), "{t:?} / {d:?}");
        }
    }
}
