//! Tests of the placement advice's inputs from the run's shapes: the FLOP ratio by the row's
//! length, and the memory estimate (src/engine/model/memory.rs) against the measured peaks.

use crate::engine::model::fp8::TargetPrecision;
use crate::engine::train::presets::Preset;

/// The placement advice follows the row's length: at 8B shapes the drafter's work is per anchor
/// (512 a row at any length) while the target's grows with the row, so on long rows the drafter's
/// share falls and the advice gives the target more of the GPUs (on 8 GPUs: 3 targets + 5
/// drafters at 3K, a target and a drafter on each GPU at 32K).
#[test]
fn placement_advice_follows_the_rows_length() {
    let p = Preset::by_name("qwen3-8b").unwrap();
    let spec = p.drafter_spec(&p.target);
    let ratio = |seq| crate::engine::model::flops::flop_ratio(&p.target, &spec, seq, 512);
    let (short, long) = (ratio(3072), ratio(32768));
    assert!(short > 1.0 && long < 0.5, "3K {short}, 32K {long}");
    let targets = |r| crate::telemetry::placement::advise(r, 8).devices().0.len();
    let text = |r| crate::telemetry::placement::advise(r, 8).text();
    assert!(
        targets(long) > targets(short),
        "{} / {}",
        text(short),
        text(long)
    );
}

fn memory_of(preset: &str, seq: i64) -> crate::engine::model::memory::MemoryNeed {
    memory_at(preset, seq, TargetPrecision::Bf16)
}

fn memory_at(
    preset: &str,
    seq: i64,
    precision: TargetPrecision,
) -> crate::engine::model::memory::MemoryNeed {
    let p = Preset::by_name(preset).unwrap();
    let spec = p.drafter_spec(&p.target);
    crate::engine::model::memory::need(&p.target, precision, 8.0, &spec, seq, 512, 1)
}

/// With the target in FP8 its layers take a byte a weight: at 8B the estimate falls by the
/// 6.1 GiB that `bench engine` measured on one H100 (38.72 to 32.65 GiB peak,
/// docs/runs/fp8-abba-h100.txt), and the drafter's side is unchanged.
#[test]
fn an_fp8_target_is_estimated_at_a_byte_a_weight() {
    let (bf16, fp8) = (
        memory_of("qwen3-8b", 3072),
        memory_at("qwen3-8b", 3072, TargetPrecision::Fp8),
    );
    assert_eq!(fp8.drafter_gib, bf16.drafter_gib);
    assert_eq!(fp8.shared_gib, bf16.shared_gib);
    let est = fp8.together_gib();
    assert!((est / 32.65 - 1.0).abs() < 0.05, "estimated {est:.1} GiB");
    assert!(bf16.together_gib() - est > 5.5, "{bf16:?} {fp8:?}");
    // It loads a layer at a time, each quantized before the next comes: the load's peak is its
    // FP8 layers, one layer in bf16 (192.9M weights at 8B) and the f32 copies of the largest
    // weight while it is quantized (13 bytes of each of 4,096 x 12,288), not the bf16 layers.
    const GIB: f64 = (1u64 << 30) as f64;
    let one_layer = 192_937_984.0 * 2.0 / GIB;
    let copies = 13.0 * 4096.0 * 12288.0 / GIB;
    let fp8_layers = bf16.target_load_gib / 2.0;
    assert!(
        (fp8.target_load_gib - fp8_layers - one_layer - copies).abs() < 1e-6,
        "{fp8:?}"
    );
    assert!(
        fp8.target_load_gib < 0.6 * bf16.target_load_gib,
        "{fp8:?} {bf16:?}"
    );
    // A card of its own must hold the larger of the load and the target's steady state.
    let heavy_load = crate::engine::model::memory::MemoryNeed {
        drafter_gib: 0.0,
        target_load_gib: 1e3,
        ..fp8
    };
    assert_eq!(heavy_load.apart_gib(), 1e3 + fp8.shared_gib);
}

/// The memory estimate (src/engine/model/memory.rs) against the peaks `bench engine` measured
/// with a target and a drafter sharing one H100 (docs/performance.md, peak_allocated_gib): each
/// within 5%; with bf16 moments at 8B (docs/runs/optimizer-states-h100.txt) and at 32B with an
/// FP8 target too; 14B and 32B since the block attention kernels take their heads
/// (docs/runs/gqa-chunks-h100.txt).
#[test]
fn the_memory_estimate_is_near_the_peaks_measured_on_one_card() {
    use crate::engine::train::optim::moments::MomentPrecision::{Bf16, F32};
    for (preset, seq, (precision, states), measured) in [
        ("qwen3-0.6b", 3072, (TargetPrecision::Bf16, F32), 5.14),
        ("qwen3-8b", 3072, (TargetPrecision::Bf16, F32), 38.72),
        ("qwen3-8b", 32768, (TargetPrecision::Bf16, F32), 46.1),
        ("qwen3-8b", 3072, (TargetPrecision::Bf16, Bf16), 34.81),
        ("qwen3-14b", 3072, (TargetPrecision::Bf16, F32), 63.23),
        ("qwen3-32b", 3072, (TargetPrecision::Fp8, Bf16), 73.59),
    ] {
        let p = Preset::by_name(preset).unwrap();
        let spec = p.drafter_spec(&p.target);
        let est = crate::engine::model::memory::need(
            &p.target,
            precision,
            states.bytes(),
            &spec,
            seq,
            512,
            1,
        )
        .together_gib();
        assert!(
            (est / measured - 1.0).abs() < 0.05,
            "{preset} at {seq} {states:?}: estimated {est:.1} GiB, measured {measured}"
        );
    }
}

/// Hand counts (docs/multi-host.md): Qwen3-32B's drafter is 2.569B parameters, 38.3 GiB at 16
/// bytes; its target builds 62 layers of 487.6M, and its embedding and head are 151,936 x 5,120
/// each. Together more than an 80 GB card holds, so two such cards take a role each.
#[test]
fn qwen3_32b_is_counted_by_hand_and_gets_a_card_for_each_role() {
    const GIB: f64 = (1u64 << 30) as f64;
    let n = memory_of("qwen3-32b", 3072);
    let drafter_act = (50.7 * 5120.0 + 58.1 * 25600.0) * 512.0 * 16.0 / GIB;
    assert!(
        (n.drafter_gib - drafter_act - 1.0 - 38.28).abs() < 0.05,
        "{n:?}"
    );
    let target_act = 64.0 * 5120.0 * 3072.0 / GIB;
    let layers = 62.0 * 487.6e6 * 2.0 / GIB;
    assert!((n.target_gib - target_act - layers).abs() < 0.1, "{n:?}");
    assert!((n.shared_gib - 2.0 * 151_936.0 * 5120.0 * 2.0 / GIB).abs() < 1e-9);
    use crate::telemetry::placement::{advise_in, Room};
    let h100 = Room {
        together_gib: n.together_gib(),
        apart_gib: n.apart_gib(),
        card_gib: 79.2,
    };
    assert!(n.together_gib() > 79.2 && n.apart_gib() < 77.0, "{n:?}");
    let p = Preset::by_name("qwen3-32b").unwrap();
    let spec = p.drafter_spec(&p.target);
    let ratio = crate::engine::model::flops::flop_ratio(&p.target, &spec, 3072, 512);
    let (t, d) = advise_in(ratio, 2, Some(h100)).devices();
    assert_eq!(
        (t, d),
        (vec![0], vec![1]),
        "{}",
        advise_in(ratio, 2, Some(h100)).text()
    );
    // On an H200 (140 GiB) they share, as the rate says.
    let h200 = Room {
        card_gib: 140.4,
        ..h100
    };
    assert_eq!(advise_in(ratio, 2, Some(h200)).crowded, None);
    // 8B fits an 80 GB card together.
    let n8 = memory_of("qwen3-8b", 3072);
    assert!(n8.together_gib() < 77.0, "{n8:?}");
}
