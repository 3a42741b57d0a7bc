//! The FP8 target against the bf16 one (`bench precision`): the same target built twice, once
//! with its linear layers in FP8 (src/engine/model/fp8.rs), run on the same batches; for each
//! captured layer, how far the FP8 target's hidden states are from the bf16 target's. These
//! states are what the drafter trains on, so this is FP8's cost before any training.

use crate::engine::data::Packer;
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::model::target_graph::TargetForward;
use crate::engine::pipeline::workers::DataCounts;
use crate::engine::pipeline::{build_target, data_source};
use crate::engine::spec::PipelineSpec;
use anyhow::Result;
use tch::{Kind, Tensor};

/// One captured layer's gap over the batches.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerGap {
    /// The target layer the drafter reads.
    pub layer: i64,
    /// ‖h_fp8 − h_bf16‖ / ‖h_bf16‖ over every token of the batches.
    pub relative_error: f64,
    /// The mean over tokens of the cosine between a token's two states.
    pub cosine: f64,
}

/// What `run` measured: the tokens it ran and each captured layer's gap.
#[derive(Clone, Debug)]
pub struct PrecisionGap {
    pub tokens: i64,
    pub layers: Vec<LayerGap>,
}

/// `batches` batches of `cfg`'s data through its target in bf16 and in FP8 (both on
/// `cfg.target_devices[0]`, the same seeded or loaded weights).
pub fn run(cfg: &PipelineSpec, batches: usize) -> Result<PrecisionGap> {
    crate::engine::gpu::fast_paths::install(cfg.fast_paths);
    let dev = cfg.target_devices[0];
    let spec = &cfg.drafter_spec;
    let build = |precision| {
        tch::manual_seed(cfg.seed as i64);
        let cfg = PipelineSpec {
            target_precision: precision,
            ..cfg.clone()
        };
        build_target(&cfg, &cfg.target_config, &spec.target_layer_ids, dev)
    };
    let (_vs_bf16, bf16) = build(TargetPrecision::Bf16)?;
    let (_vs_fp8, fp8) = build(TargetPrecision::Fp8)?;
    let counts = std::sync::Arc::new(DataCounts::default());
    let mut source = data_source(cfg, &cfg.target_config, spec, &counts)?;
    let mut packer = Packer::new();
    let (mut fw_bf16, mut fw_fp8) = (
        TargetForward::new(&bf16, dev),
        TargetForward::new(&fp8, dev),
    );
    let n = spec.target_layer_ids.len();
    let (mut diff2, mut ref2, mut cos) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let mut tokens = 0;
    for _ in 0..batches.max(1) {
        let b = packer
            .pack(source.as_mut(), cfg.batch, cfg.seq_len)?
            .to_device(dev);
        let _g = tch::no_grad_guard();
        let h = fw_bf16.run(&bf16, &b, false)?.to_kind(Kind::Float);
        let h8 = fw_fp8.run(&fp8, &b, false)?.to_kind(Kind::Float);
        // [rows, seq, layers * hidden] -> each layer's [tokens, hidden]
        let per_layer = |t: &Tensor| t.reshape([b.rows * b.seq, n as i64, -1]).unbind(1);
        for (i, (a, r)) in per_layer(&h8).iter().zip(per_layer(&h)).enumerate() {
            let sum = |t: Tensor| f64::try_from(t.sum(Kind::Double)).unwrap_or(f64::NAN);
            diff2[i] += sum((a - &r).square());
            ref2[i] += sum(r.square());
            let c = Tensor::cosine_similarity(a, &r, 1, 1e-8);
            cos[i] += sum(c);
        }
        tokens += b.rows * b.seq;
    }
    let layers = spec
        .target_layer_ids
        .iter()
        .enumerate()
        .map(|(i, &layer)| LayerGap {
            layer,
            relative_error: (diff2[i] / ref2[i]).sqrt(),
            cosine: cos[i] / tokens as f64,
        })
        .collect();
    Ok(PrecisionGap { tokens, layers })
}
