//! Tests of `--optimizer-states` (src/engine/train/optim/moments.rs): where the value comes from,
//! and what it takes off the memory estimate.

use super::{target_dir, train};
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::train::optim::moments::MomentPrecision;
use crate::engine::train::presets::Preset;

/// f32 unless the flag or the TOML file says bf16; the config line shows it; a value of neither
/// is named with the fix.
#[test]
fn the_optimizer_states_come_from_the_flag_or_the_file() {
    let dir = target_dir(Some(300));
    let c = train(dir.path(), |_| {}).unwrap();
    assert_eq!(c.optimizer_states, MomentPrecision::F32);
    assert!(c.recipe_line().contains("optimizer_states=f32"));
    let c = train(dir.path(), |a| a.optimizer_states = Some("bf16".into())).unwrap();
    assert_eq!(c.optimizer_states, MomentPrecision::Bf16);
    assert!(c.recipe_line().contains("optimizer_states=bf16"));
    let toml = dir.path().join("states.toml");
    std::fs::write(&toml, "optimizer_states = \"bf16\"\n").unwrap();
    let c = train(dir.path(), |a| a.config = Some(toml)).unwrap();
    assert_eq!(c.optimizer_states, MomentPrecision::Bf16);
    let e = train(dir.path(), |a| a.optimizer_states = Some("int8".into())).unwrap_err();
    assert!(
        format!("{e:#}").contains("optimizer_states) `int8`: use f32 or bf16"),
        "{e:#}"
    );
}

/// bf16 moments take 4 bytes a drafter parameter off the drafter's side and nothing else: at
/// qwen3-32b's shapes (a drafter of 2.57B parameters at width 5,120) that is 9.6 GiB, which
/// with an FP8 target brings a target and a drafter on one card under an 80 GB H100's 79.2 GiB.
#[test]
fn bf16_moments_take_four_bytes_a_drafter_parameter_off_the_estimate() {
    let p = Preset::by_name("qwen3-32b").unwrap();
    let spec = p.drafter_spec(&p.target);
    let at = |precision, states: MomentPrecision| {
        crate::engine::model::memory::need(
            &p.target,
            precision,
            states.bytes(),
            &spec,
            3072,
            512,
            1,
        )
    };
    let (wide, narrow) = (
        at(TargetPrecision::Fp8, MomentPrecision::F32),
        at(TargetPrecision::Fp8, MomentPrecision::Bf16),
    );
    assert_eq!(wide.target_gib, narrow.target_gib);
    assert_eq!(wide.shared_gib, narrow.shared_gib);
    let h = p.target.hidden_size as f64;
    let params = spec.layers.num_hidden_layers as f64
        * (h * (2.0 * 8192.0 + 2.0 * 1024.0) + 3.0 * h * 25600.0)
        + spec.target_layer_ids.len() as f64 * h * h;
    let saved = wide.drafter_gib - narrow.drafter_gib;
    let want = 4.0 * params / (1u64 << 30) as f64;
    assert!(
        (saved - want).abs() < 1e-9,
        "saved {saved:.2} GiB, want {want:.2}"
    );
    assert!((saved - 9.6).abs() < 0.1, "{saved:.2} GiB");
    // An 80 GB H100 holds 79.2 GiB: it ran at a peak of 75.03 (docs/runs).
    assert!(wide.together_gib() > 79.2, "{wide:?}");
    assert!(narrow.together_gib() < 77.0, "{narrow:?}");
    let bf16 = at(TargetPrecision::Bf16, MomentPrecision::Bf16).together_gib();
    assert!(bf16 > 90.0, "a bf16 32B target needs an H200: {bf16:.1}");
}

/// After an out-of-memory, the note names the first memory lever that would fit the card:
/// Qwen3-32B on an 80 GB card (79.2 GiB) needs both levers in bf16 (112.8 GiB as set, 75.0
/// with both), only bf16 moments with an FP8 target (84.6 → 75.0), none where both are set; a
/// GPU without FP8 GEMMs is offered only the moments (and told they are not enough).
#[test]
fn the_memory_note_names_the_first_lever_that_fits_the_card() {
    let spec = |extra: &dyn Fn(&mut crate::config::cli::TrainArgs)| {
        let mut a = crate::config::cli::TrainArgs {
            preset: Some("qwen3-32b".into()),
            ..Default::default()
        };
        extra(&mut a);
        crate::config::RunConfig::from_args(&a).unwrap().pipeline
    };
    let card = Some(79.2);
    let bf16 = spec(&|_| {});
    let note = bf16.memory_note(card, true);
    assert!(
        note.starts_with("by the shapes a target and a drafter together need about 113 GiB, the GPU holds 79 GiB; with --target-precision fp8 --optimizer-states bf16 about 75 GiB"),
        "{note}"
    );
    // Without FP8 GEMMs no lever fits: what the run would need even with the one there is.
    let note = bf16.memory_note(card, false);
    assert!(
        note.ends_with("the GPU holds 79 GiB; even with --optimizer-states bf16 about 103 GiB"),
        "{note}"
    );
    // On the CPU, with no card to fit, the first lever.
    let note = bf16.memory_note(None, false);
    assert!(
        note.ends_with("need about 113 GiB; with --optimizer-states bf16 about 103 GiB"),
        "{note}"
    );
    let fp8 = spec(&|a| a.target_precision = Some("fp8".into()));
    let note = fp8.memory_note(card, true);
    assert!(
        note.ends_with("; with --optimizer-states bf16 about 75 GiB"),
        "{note}"
    );
    let both = spec(&|a| {
        a.target_precision = Some("fp8".into());
        a.optimizer_states = Some("bf16".into());
    });
    assert!(both.memory_levers(true).is_empty());
    assert!(!both.memory_note(card, true).contains("with --"));
    // On a card of 139 GiB (an H200) the bf16 target with bf16 moments fits first.
    let note = bf16.memory_note(Some(139.7), true);
    assert!(
        note.ends_with("; with --optimizer-states bf16 about 103 GiB"),
        "{note}"
    );
}
