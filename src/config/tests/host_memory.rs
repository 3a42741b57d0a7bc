//! Tests of the host-memory floor for a run on the CPU (src/engine/model/memory.rs
//! `host_weights_gib`, src/engine/spec.rs `host_memory_refusal`): a preset whose weights alone do
//! not fit the host is refused with a sentence before anything is built.

use crate::config::cli::TrainArgs;
use crate::config::RunConfig;

fn spec(preset: &str, extra: &dyn Fn(&mut TrainArgs)) -> crate::engine::spec::PipelineSpec {
    let mut a = TrainArgs {
        preset: Some(preset.into()),
        ..Default::default()
    };
    extra(&mut a);
    RunConfig::from_args(&a).unwrap().pipeline
}

/// Qwen3-8B's weights on the CPU by hand from its public config (hidden 4096, 32 query and 8 KV
/// heads of 128, MLP 12288, vocabulary 151936, head not tied): each target layer built and the
/// embedding and head in f32, the drafter's 5 layers and fc at 16 bytes a parameter (weight,
/// gradient, f32 moments).
#[test]
fn the_host_floor_counts_the_weights_in_f32() {
    let s = spec("qwen3-8b", &|a| a.target_devices = Some("cpu".into()));
    let layer = 4096.0 * (2.0 * 4096.0 + 2.0 * 1024.0) + 3.0 * 4096.0 * 12288.0;
    let ids = &s.drafter_spec.target_layer_ids;
    let built = (*ids.iter().max().unwrap() + 1) as f64;
    let fc = ids.len() as f64 * 4096.0 * 4096.0;
    let bytes = built * layer * 4.0 + 2.0 * 151936.0 * 4096.0 * 4.0 + (5.0 * layer + fc) * 16.0;
    let want = bytes / (1u64 << 30) as f64;
    let got = s.host_weights_gib().unwrap();
    assert!((got - want).abs() < 1e-9, "{got} against {want}");
    // bf16 moments take 4 bytes a drafter parameter off.
    let bf16 = spec("qwen3-8b", &|a| {
        a.target_devices = Some("cpu".into());
        a.optimizer_states = Some("bf16".into());
    });
    let saved = got - bf16.host_weights_gib().unwrap();
    assert!((saved - (5.0 * layer + fc) * 4.0 / (1u64 << 30) as f64).abs() < 1e-9);
}

/// Refused where the host memory needed is more than the host has, with the preset, the sides on
/// the CPU, the figures and the fix; not where it fits, nor where both sides are on GPUs, even
/// with a `--target` whose checkpoint is larger than the host (it is read a tensor at a time).
#[test]
fn a_preset_too_large_for_the_host_is_refused_with_the_fix() {
    let big = spec("qwen3-32b", &|_| {});
    let need = big.host_weights_gib().unwrap();
    let text = big.host_memory_refusal(23.0).unwrap();
    assert_eq!(
        text,
        format!(
            "--preset qwen3-32b with the target and the drafter on the CPU needs at least \
             {need:.1} GiB of host memory (the weights on the CPU, f32 there), and this machine \
             has 23.0 GiB available (free memory and swap, within its cgroup's limit); train it \
             on GPUs (--target-devices cuda:0 --drafter-devices cuda:0) or pick a smaller \
             --preset (tiny, qwen3-0.6b)"
        )
    );
    assert_eq!(big.host_memory_refusal(need + 1.0), None);
    let tiny = spec("tiny", &|_| {});
    assert!(tiny.host_weights_gib().unwrap() < 0.5);
    assert_eq!(tiny.host_memory_refusal(23.0), None);
    // (devices set on the spec: this machine may have no GPU for the flags to name)
    let mut on_gpus = spec("qwen3-32b", &|_| {});
    on_gpus.target_devices = vec![tch::Device::Cuda(0)];
    on_gpus.drafter_devices = vec![tch::Device::Cuda(0)];
    assert_eq!(on_gpus.host_weights_gib(), None);
    assert_eq!(on_gpus.host_memory_refusal(1.0), None);
    on_gpus.target = Some("/models/Qwen3-32B".into());
    assert_eq!(on_gpus.host_memory_refusal(1.0), None);
    // A real target on the CPU: the fix names more memory, not a smaller preset.
    let mut real = big.clone();
    real.target = Some("/models/Qwen3-32B".into());
    let text = real.host_memory_refusal(23.0).unwrap();
    assert!(
        text.starts_with(
            "--target /models/Qwen3-32B with the target and the drafter on the CPU needs"
        ),
        "{text}"
    );
    assert!(text.ends_with("or on a machine with more memory"), "{text}");
}

/// Each side on the CPU counts its own weights, the embedding and head once with either, and an
/// FP8 target's layers a byte a weight.
#[test]
fn each_side_on_the_cpu_counts_its_own_weights() {
    let both = spec("qwen3-8b", &|_| {});
    let mut target_only = both.clone();
    target_only.drafter_devices = vec![tch::Device::Cuda(0)];
    let mut drafter_only = both.clone();
    drafter_only.target_devices = vec![tch::Device::Cuda(0)];
    let (all, t, d) = (
        both.host_weights_gib().unwrap(),
        target_only.host_weights_gib().unwrap(),
        drafter_only.host_weights_gib().unwrap(),
    );
    // The embedding and head, 2 x 151936 x 4096 in f32, are in each and once in both.
    let shared = 2.0 * 151936.0 * 4096.0 * 4.0 / (1u64 << 30) as f64;
    assert!(
        (t + d - shared - all).abs() < 1e-9,
        "{t} + {d} - {shared} against {all}"
    );
    assert!(t > d, "the target's layers are more than the drafter's");
    let text = drafter_only.host_memory_refusal(1.0).unwrap();
    assert!(text.starts_with("--preset qwen3-8b with the drafter on the CPU needs"));
    let mut fp8 = target_only.clone();
    fp8.target_precision = crate::engine::model::fp8::TargetPrecision::Fp8;
    let layers = t - shared;
    let fp8_layers = fp8.host_weights_gib().unwrap() - shared;
    assert!(
        (fp8_layers * 4.0 - layers).abs() < 1e-9,
        "{fp8_layers} against {layers}"
    );
}
