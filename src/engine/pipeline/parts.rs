//! What a pipeline is built from: the target (one per target device) and the drafter replicas
//! with their optimizers (fresh, from --drafter, or resumed), the frozen embedding and lm head
//! as a drafter reads them, and the data source (sharded by rank in a job, skipped ahead on
//! resume).

use crate::engine::checkpoint;
use crate::engine::data::jsonl::JsonlOptions;
use crate::engine::data::jsonl::JsonlSource;
use crate::engine::data::{DocSource, Synthetic};
use crate::engine::model::drafter::Drafter;
use crate::engine::model::fp8::TargetPrecision;
use crate::engine::model::qwen3::{DecoderLayer, Qwen3Target};
use crate::engine::model::shapes::{DrafterSpec, Qwen3Config};
use crate::engine::pipeline::workers::DataCounts;
use crate::engine::spec::{DataSpec, PipelineSpec};
use crate::engine::train::optim::AdamW;
use anyhow::Result;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tch::{nn::VarStore, Device, Kind};

/// The target: shapes from --target's config.json or the preset, weights from the directory (a
/// tensor read from disk at a time: one tensor in host memory at once) or random (seeded); its
/// linear layers in FP8 with `--target-precision fp8`, each layer loaded and quantized before the
/// next one is made (one layer's bf16 weights on the device at a time).
pub(crate) fn build_target(
    cfg: &PipelineSpec,
    target_cfg: &Qwen3Config,
    capture: &[i64],
    device: Device,
) -> Result<(VarStore, Qwen3Target)> {
    use crate::engine::model::weights::{copy_matching, weights_label, WeightFiles};
    let fp8 = cfg.target_precision == TargetPrecision::Fp8;
    if fp8 {
        // Before anything is read: a GPU without FP8 GEMMs is told at once.
        crate::engine::model::fp8::check_device(device)?;
    }
    let mut vs = VarStore::new(device);
    if device.is_cuda() {
        // Made in bf16, not made in f32 and cast: the load's peak is the weights' bf16 bytes
        // (59 GiB for qwen3-32b's built layers, where f32 first would peak at twice that).
        vs.set_kind(Kind::BFloat16);
    }
    let weights = match &cfg.target {
        Some(dir) => Some((WeightFiles::open(dir)?, weights_label(dir))),
        None => None,
    };
    let std = cfg.preset.embed_std;
    let mut model = if fp8 {
        let mut each = |i: i64, layer: &mut DecoderLayer| -> Result<()> {
            if let Some((files, label)) = &weights {
                let prefix = format!("model.layers.{i}.");
                copy_matching(&vs, files, label, &|n| n.starts_with(&prefix))?;
            }
            layer.quantize_fp8();
            Ok(())
        };
        Qwen3Target::new_layer_by_layer(&vs.root(), target_cfg, capture, std, &mut each)?
    } else {
        Qwen3Target::new(&vs.root(), target_cfg, capture, std)
    };
    if let Some((files, label)) = &weights {
        // Everything a layer-by-layer load left (all of a bf16 target).
        copy_matching(&vs, files, label, &|n| {
            !fp8 || !n.starts_with("model.layers.")
        })?;
        files.report_done();
    }
    vs.freeze();
    if !fp8 {
        // (An FP8 layer fused its q, k and v as it was quantized.)
        model.fuse_projections();
    }
    Ok((vs, model))
}

/// Drafter replicas, one per device, all with replica 0's weights: fresh (seeded) or from
/// --resume / --drafter.
pub(crate) fn build_drafters(
    cfg: &PipelineSpec,
    devices: &[Device],
) -> Result<Vec<(VarStore, Drafter, Device)>> {
    let spec = &cfg.drafter_spec;
    let mut built = Vec::new();
    for &dev in devices {
        tch::manual_seed(cfg.seed as i64 + 1);
        let vs = VarStore::new(dev);
        let model = Drafter::new(&vs.root(), spec);
        built.push((vs, model, dev));
    }
    if let Some(dir) = cfg.resume.as_ref().or(cfg.drafter.as_ref()) {
        checkpoint::load_weights(dir, &built[0].0)?;
    }
    let _g = tch::no_grad_guard();
    let first = built[0].0.variables();
    for (vs, _, _) in built.iter().skip(1) {
        for (name, mut var) in vs.variables() {
            var.copy_(&first[&name]);
        }
    }
    Ok(built)
}

/// The target's frozen embedding or lm head as a drafter on `dev` reads it (bf16 on a GPU).
pub(crate) fn frozen_on(t: &tch::Tensor, dev: Device) -> tch::Tensor {
    let kind = if dev.is_cuda() {
        Kind::BFloat16
    } else {
        Kind::Float
    };
    t.to_device(dev).to_kind(kind)
}

pub(crate) fn data_source(
    cfg: &PipelineSpec,
    target_cfg: &Qwen3Config,
    spec: &DrafterSpec,
    counts: &Arc<DataCounts>,
) -> Result<Box<dyn DocSource>> {
    let mut source: Box<dyn DocSource> = match &cfg.data {
        DataSpec::Synthetic => {
            // Synthetic tokens stay below the mask token.
            let vocab = spec.mask_token_id.min(target_cfg.vocab_size).min(4096);
            Box::new(Synthetic::new(cfg.seed, vocab, cfg.seq_len / 2))
        }
        DataSpec::Jsonl(p) => {
            let counts = counts.clone();
            let opts = JsonlOptions {
                tokenizer: cfg.target.as_ref().map(|d| d.join("tokenizer.json")),
                chat: cfg.chat.clone(),
                // SpecForge's minimum: a document trains when two of its tokens carry loss.
                min_loss_tokens: 2,
                seed: Some(cfg.seed),
                threads: match cfg.data_threads {
                    Some(n) => n,
                    None => crate::engine::data::jsonl::reading_threads(),
                },
                on_dropped: Some(Box::new(move |n| {
                    counts.dropped_docs.fetch_add(n, Ordering::Relaxed);
                })),
                ..JsonlOptions::new(target_cfg.vocab_size)
            };
            Box::new(JsonlSource::open(p, opts)?)
        }
    };
    // A resumed run continues where its data stood.
    source.skip(resumed_docs(cfg))?;
    if let Some(job) = &cfg.job {
        source = Box::new(crate::engine::data::Sharded::new(
            source, job.rank, job.world,
        ));
    }
    Ok(source)
}

pub(super) fn resumed_docs(cfg: &PipelineSpec) -> u64 {
    cfg.resume_state.as_ref().map_or(0, |s| s.data_docs)
}

/// The targets, one per target device (built one after another, so that seeded random weights
/// are the same).
pub(super) fn build_targets(cfg: &PipelineSpec) -> Result<Vec<(VarStore, Qwen3Target)>> {
    crate::fault::oom_at_build("target");
    let spec = &cfg.drafter_spec;
    let mut targets = Vec::new();
    for &dev in &cfg.target_devices {
        targets.push(build_target(
            cfg,
            &cfg.target_config,
            &spec.target_layer_ids,
            dev,
        )?);
    }
    Ok(targets)
}

/// A drafter replica, ready for its worker.
pub(super) struct DrafterReplica {
    pub(super) vs: VarStore,
    pub(super) model: Drafter,
    pub(super) optimizer: AdamW,
    /// The target's frozen embedding and lm head, on `device`.
    pub(super) embed: tch::Tensor,
    pub(super) lm_head: tch::Tensor,
    pub(super) device: Device,
}

/// The drafter replicas, each with its optimizer (resumed with --resume) and `target`'s frozen
/// embedding and lm head; and the step the run starts from.
pub(super) fn drafter_replicas(
    cfg: &PipelineSpec,
    target: &Qwen3Target,
) -> Result<(Vec<DrafterReplica>, u64)> {
    let (embed, lm_head) = (
        target.embed_tokens.shallow_clone(),
        target.lm_head.shallow_clone(),
    );
    crate::fault::oom_at_build("drafter");
    let built = build_drafters(cfg, &cfg.drafter_devices)?;
    let mut start_step = 0;
    let mut drafters = Vec::new();
    for (vs, model, dev) in built {
        let params: Vec<_> = vs.variables().into_iter().collect();
        let mut optimizer = AdamW::for_drafter(params, cfg.optimizer_states);
        if let (Some(dir), Some(state)) = (&cfg.resume, &cfg.resume_state) {
            optimizer.load(&dir.join(checkpoint::OPTIMIZER_FILE))?;
            optimizer.step = state.step as i64;
            start_step = state.step;
        }
        drafters.push(DrafterReplica {
            vs,
            model,
            optimizer,
            embed: frozen_on(&embed, dev),
            lm_head: frozen_on(&lm_head, dev),
            device: dev,
        });
    }
    Ok((drafters, start_step))
}
