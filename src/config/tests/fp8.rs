//! Tests of `--target-precision` (src/engine/model/fp8.rs): where the value comes from, and an
//! FP8 target's load a layer at a time.

use super::{target_dir, train};
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::spec::PipelineSpec;

/// bf16 unless the flag or the TOML file says fp8; the config line shows it; a value of neither
/// is named with the fix.
#[test]
fn the_target_precision_comes_from_the_flag_or_the_file() {
    let dir = target_dir(Some(300));
    let c = train(dir.path(), |_| {}).unwrap();
    assert_eq!(c.target_precision, TargetPrecision::Bf16);
    assert!(c.recipe_line().contains("target_precision=bf16"));
    let c = train(dir.path(), |a| a.target_precision = Some("fp8".into())).unwrap();
    assert_eq!(c.target_precision, TargetPrecision::Fp8);
    assert!(c.recipe_line().contains("target_precision=fp8"));
    let fp8_toml = dir.path().join("fp8.toml");
    std::fs::write(&fp8_toml, "target_precision = \"fp8\"\n").unwrap();
    let c = train(dir.path(), |a| a.config = Some(fp8_toml)).unwrap();
    assert_eq!(c.target_precision, TargetPrecision::Fp8);
    let e = train(dir.path(), |a| a.target_precision = Some("int8".into())).unwrap_err();
    assert!(
        format!("{e:#}").contains("target_precision) `int8`: use bf16 or fp8"),
        "{e:#}"
    );
}

/// An FP8 target is loaded a layer at a time (each layer's weights copied and quantized before the
/// next is made): it is the target loaded whole and quantized after, to the bit (a layer left
/// unloaded, loaded into the wrong layer, or quantized before its weights came would differ), it
/// is not the bf16 target, and every projection's own weight is given back. On the trained
/// language target `make reference` writes.
#[test]
fn an_fp8_target_loaded_layer_by_layer_is_the_one_quantized_after() {
    use crate::engine::model::qwen3::{built_layers, Qwen3Target};
    use crate::engine::model::weights::{copy_into, WeightFiles};
    use tch::{Device, Kind, Tensor};
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference/lm/target");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: `make reference` writes it",
        dir.display()
    );
    let spec = |precision: &str| {
        train(&dir, |a| {
            a.mask_token_id = Some(50);
            a.target_precision = Some(precision.into());
        })
        .unwrap()
    };
    let (fp8, bf16) = (spec("fp8"), spec("bf16"));
    let capture = fp8.drafter_spec.target_layer_ids.clone();
    let build = |c: &PipelineSpec| {
        crate::engine::pipeline::build_target(c, &c.target_config, &capture, Device::Cpu).unwrap()
    };
    let (vs_fp8, by_layer) = build(&fp8);
    let (_, plain) = build(&bf16);
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let mut whole = Qwen3Target::new(&vs.root(), &fp8.target_config, &capture, 0.02);
    copy_into(&vs, &WeightFiles::open(&dir).unwrap(), &dir).unwrap();
    whole.fuse_projections();
    whole.quantize_fp8();

    tch::manual_seed(5);
    let ids = Tensor::randint(200, [2, 48], (Kind::Int64, Device::Cpu));
    let pos = Tensor::arange(48, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([2, 1]);
    let docs = Tensor::zeros([2, 48], (Kind::Int64, Device::Cpu));
    let run = |t: &Qwen3Target| tch::no_grad(|| t.forward(&ids, &pos, &docs));
    let h = run(&by_layer);
    assert!(
        h.equal(&run(&whole)),
        "loaded layer by layer, not the whole-then-quantized target"
    );
    let gap = f64::try_from((&h - run(&plain)).norm() / run(&plain).norm()).unwrap();
    assert!(gap > 1e-4 && gap < 0.1, "FP8 {gap} from the bf16 target");
    let emptied = vs_fp8
        .variables()
        .values()
        .filter(|t| t.numel() == 0)
        .count() as i64;
    assert_eq!(emptied, built_layers(&fp8.target_config, &capture) * 7);
}
