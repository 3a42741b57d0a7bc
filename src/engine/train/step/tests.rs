//! Tests of the drafter's training step (src/engine/train/step.rs): built from a resolved
//! run configuration and real data, as the pipeline builds it.

use super::*;

use crate::config::cli::TrainArgs;
use crate::config::RunConfig;
use crate::engine::data::{Packer, Rng};
use crate::engine::pipeline::workers::DataCounts;
use crate::engine::pipeline::{build_drafters, build_target, data_source, frozen_on};
use crate::engine::train::grad_mean::Single;
use tch::Kind;

/// Each row's anchors, sampled from `rng` as the worker does (its own function).
fn rows_anchors(
    b: &PackedBatch,
    cfg: &crate::engine::spec::PipelineSpec,
    rng: &mut Rng,
) -> Vec<Vec<i64>> {
    crate::engine::pipeline::drafter_worker::anchors::anchors_by_row(
        b,
        cfg.anchors,
        cfg.anchor_scope,
        rng,
    )
}

/// A step probe on a stream of the thread's own, as a worker's.
struct OwnStream;

impl StepProbe for OwnStream {
    fn mark(&mut self, _: Phase) {}
    fn own_stream(&self) -> bool {
        true
    }
}

fn flat(step: &mut DrafterStep) -> Tensor {
    step.optimizer.flat_params().to_device(Device::Cpu)
}

/// Two copies of the tiny preset's drafter on the last GPU, made by `make` from its var
/// store and graphs setting (the first with graphs for one plan, the second eager), trained
/// on the same 10 batches (rows of 768, 64 anchors: windows on a 128-key grid that vary
/// from batch to batch); the last batch has every label masked out. Returns each step's
/// two outcomes, the two steps, and the weights before.
fn side_by_side_on_cuda(
    make: impl Fn(&tch::nn::VarStore, usize) -> AdamW,
) -> (Vec<(StepOutcome, StepOutcome)>, [DrafterStep; 2], Tensor) {
    side_by_side_of("tiny", None, make)
}

/// `side_by_side_on_cuda` of `preset`'s drafter, the second copy's steps run with `plain`
/// turned off (on the test's thread) where one is given.
fn side_by_side_of(
    preset: &str,
    plain: Option<crate::engine::gpu::fast_paths::FastPath>,
    make: impl Fn(&tch::nn::VarStore, usize) -> AdamW,
) -> (Vec<(StepOutcome, StepOutcome)>, [DrafterStep; 2], Tensor) {
    // The last GPU: on a host of two, not the thread's current device (a capture must find
    // the worker's stream on the worker's device).
    let last = tch::Cuda::device_count() as usize - 1;
    let dev = Device::Cuda(last);
    let _stream = crate::engine::gpu::cuda::Stream::own(dev).unwrap();
    let args = TrainArgs {
        preset: Some(preset.into()),
        target_devices: Some(format!("cuda:{last}")),
        drafter_devices: Some(format!("cuda:{last}")),
        anchors: Some(64),
        seq_len: Some(768),
        ..Default::default()
    };
    let cfg = RunConfig::from_args(&args).unwrap().pipeline;
    let (_tvs, target) = build_target(
        &cfg,
        &cfg.target_config,
        &cfg.drafter_spec.target_layer_ids,
        dev,
    )
    .unwrap();
    let built = build_drafters(&cfg, &[dev, dev]).unwrap();
    let mut steps = built
        .into_iter()
        .enumerate()
        .map(|(i, (vs, model, device))| DrafterStep {
            model,
            optimizer: make(&vs, i),
            spec: cfg.drafter_spec.clone(),
            embed: frozen_on(&target.embed_tokens, device),
            lm_head: frozen_on(&target.lm_head, device),
            device,
            replicas: Box::new(Single),
            loss_chunk_mib: 1,
            graphs: if i == 0 {
                StepGraphs::on(1)
            } else {
                StepGraphs::off()
            },
        });
    let mut pair = [steps.next().unwrap(), steps.next().unwrap()];
    // As a worker does before its first step (a lone replica's gradients in one flat buffer).
    for step in &mut pair {
        step.prepare().unwrap();
    }
    let start = flat(&mut pair[1]);
    let counts = std::sync::Arc::new(DataCounts::default());
    let mut source = data_source(&cfg, &cfg.target_config, &cfg.drafter_spec, &counts).unwrap();
    let mut packer = Packer::new();
    let mut rng = Rng::new(5);
    let mut outcomes = Vec::new();
    for i in 0..10 {
        let mut b = packer
            .pack(source.as_mut(), cfg.batch, cfg.seq_len)
            .unwrap();
        let per_row = rows_anchors(&b, &cfg, &mut rng);
        if i == 9 {
            // Anchors kept, every label masked out.
            b.host_loss_mask.fill(false);
            b.loss_mask = b.loss_mask.zeros_like();
        }
        let b = b.to_device(dev);
        let hidden = tch::no_grad(|| target.forward(&b.input_ids, &b.positions, &b.doc_ids));
        let [x, y] = &mut pair;
        let a = x.run(&hidden, &b, &per_row, 3e-3, &mut OwnStream).unwrap();
        let mut second = || y.run(&hidden, &b, &per_row, 3e-3, &mut OwnStream).unwrap();
        let e = match plain {
            Some(p) => crate::engine::gpu::fast_paths::without(p, second),
            None => second(),
        };
        assert!(a.finite && e.finite, "step {i}: {a:?} {e:?}");
        outcomes.push((a, e));
    }
    (outcomes, pair, start)
}

/// The losses of `side_by_side_on_cuda`'s steps before the last agree within `losses` of the
/// second's, and the gradients' norms within `norms` of the largest norm of the run (not of each
/// step's: once the loss flattens the norm falls twenty-fold, a sum of parts that cancel, whose
/// bf16 rounding moves it by a few percent of itself), each batch gives its own loss, the last
/// (no label counts) a zero loss and zero gradients both ways, and the weights after are within
/// `weights` of how far they moved.
fn assert_trained_alike(
    (outcomes, mut pair, start): (Vec<(StepOutcome, StepOutcome)>, [DrafterStep; 2], Tensor),
    (losses, norms, weights): (f64, f64, f64),
) -> [DrafterStep; 2] {
    let (done, last) = outcomes.split_at(outcomes.len() - 1);
    let largest = done.iter().map(|(_, e)| e.grad_norm).fold(0.0, f32::max) as f64;
    for (i, (a, e)) in done.iter().enumerate() {
        let gap = (a.loss - e.loss).abs() as f64;
        let norm_gap = (a.grad_norm - e.grad_norm).abs() as f64;
        eprintln!(
            "step {i}: loss {} / {}, grad norm {} / {}",
            a.loss, e.loss, a.grad_norm, e.grad_norm
        );
        assert!(
            gap <= losses * e.loss as f64 && norm_gap <= norms * largest,
            "step {i}: {a:?}, against {e:?}"
        );
    }
    let each: Vec<f32> = done.iter().map(|(a, _)| a.loss).collect();
    assert!(
        each.windows(2).any(|w| w[0] != w[1]),
        "each batch gives its own loss: {each:?}"
    );
    for o in [&last[0].0, &last[0].1] {
        assert_eq!((o.loss, o.grad_norm), (0.0, 0.0), "no label counts: {o:?}");
    }
    let [x, y] = &mut pair;
    let (a, e) = (flat(x), flat(y));
    let moved = f64::try_from((&e - &start).norm().to_kind(Kind::Double)).unwrap();
    let gap = f64::try_from((&a - &e).norm().to_kind(Kind::Double)).unwrap();
    eprintln!("weights moved {moved:.4e}, apart {gap:.4e}");
    assert!(
        moved > 0.0 && gap <= weights * moved,
        "moved {moved}, apart {gap}"
    );
    pair
}

/// One drafter trained through the CUDA graphs (one window plan kept: of the later batches'
/// plans, some run through it as a cover and some eagerly) and a copy of it trained eagerly
/// on the same batches: the same losses step by step and the same weights after; a graph that
/// replayed stale inputs, a covering plan that dropped a visible key, or a backward that did
/// not reach the weights, fails it. A last batch where no label counts gives a zero loss and
/// zero gradients, finite, both ways. Skipped without a GPU and the CUDA shim.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn graphed_steps_train_like_the_same_steps_run_eagerly_on_cuda() {
    if crate::engine::gpu::cuda::cuda_or_skip("the drafter step's CUDA graphs").is_none() {
        return;
    }
    // f32 weights (`--disable bf16-weights`): the graphs with bf16 weights are in the next test.
    let run = side_by_side_on_cuda(|vs, _| AdamW::new(vs.variables().into_iter().collect()));
    let [graphed, _] = assert_trained_alike(run, (1e-3, 1e-3, 1e-2));
    assert!(graphed.graphs.captured(), "the step ran through graphs");
    let [own, covering, eager_runs] = graphed.graphs.runs();
    assert_eq!(graphed.graphs.plans(), 1);
    assert!(
        own >= 1 && covering >= 1 && eager_runs >= 1,
        "steps through their own plan {own}, a covering one {covering}, eagerly {eager_runs}"
    );
}

/// The drafter trained with bf16 weights and gradients beside its f32 masters (through the
/// graphs, as a run does) against a copy with f32 weights cast at each use (eager): the
/// forward reads the same bf16 values both ways, and the gradients differ only where a
/// weight's contributions add in bf16, so the losses and the weights after agree closely;
/// a step that skipped the working weights' update, or gradients that missed the weights,
/// fails it.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn bf16_weights_train_like_f32_weights_on_cuda() {
    if crate::engine::gpu::cuda::cuda_or_skip("bf16 weights").is_none() {
        return;
    }
    let run = side_by_side_on_cuda(|vs, i| {
        let opt = AdamW::new(vs.variables().into_iter().collect());
        if i == 0 {
            opt.with_bf16_weights()
        } else {
            opt
        }
    });
    let [bf16, f32] = assert_trained_alike(run, (1e-2, 1e-2, 1e-2));
    let kinds = |s: &DrafterStep| {
        s.optimizer
            .layout()
            .map(|(_, p, _)| p.kind())
            .collect::<Vec<_>>()
    };
    assert!(
        kinds(&bf16).iter().all(|k| *k == Kind::BFloat16),
        "{:?}",
        kinds(&bf16)
    );
    assert!(
        kinds(&f32).iter().all(|k| *k == Kind::Float),
        "{:?}",
        kinds(&f32)
    );
    assert_eq!(super::super::optim::bf16_kernel_state(), "kernel");
}

/// The 0.6B drafter with bf16 weights trained with `path` (through the graphs, as a run takes
/// it) against a copy with `path` off on its thread, held to `assert_trained_alike`'s
/// tolerances for paths that round in bf16 at other places (1e-2 in the losses and the norms,
/// 0.1 in the weights: see the test below); false, having run nothing, without a GPU.
fn trains_like_the_plain_path(what: &str, path: crate::engine::gpu::fast_paths::FastPath) -> bool {
    if crate::engine::gpu::cuda::cuda_or_skip(what).is_none() {
        return false;
    }
    let run = side_by_side_of("qwen3-0.6b", Some(path), |vs, _| {
        AdamW::new(vs.variables().into_iter().collect()).with_bf16_weights()
    });
    assert_trained_alike(run, (1e-2, 1e-2, 0.1));
    true
}

/// The drafter with its own kernels (q/k norm + RoPE, silu x up, the loss's rows; through the
/// graphs, as a run takes them) against a copy running libtorch's ops eagerly
/// (`--disable drafter-kernels` on the copy's thread), at 0.6B's shapes: heads of 128, as the
/// norm + RoPE kernel and the block attention need (the tiny preset's 32 take the ops). Both
/// round in bf16 at different places, so the losses agree to bf16's rounding step by step, and
/// the gradients' norms too (to 1% of the largest: once the loss flattens the norm falls from
/// about 4.7 to 0.2, and there the two copies' norms have been 3% of themselves apart, on an
/// H100); RoPE applied twice, a norm skipped, or a kernel's gradient lost fails it. The
/// weights after are further apart than the losses say (3 to 7% of how far they moved): AdamW's
/// first steps move every weight by about the learning rate whatever its gradient's size, so a
/// gradient near zero whose sign the rounding decides moves its weight the other way.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn the_drafters_kernels_train_like_libtorchs_ops_on_cuda() {
    use crate::engine::gpu::fast_paths::FastPath;
    if !trains_like_the_plain_path("the drafter's kernels", FastPath::DrafterKernels) {
        return;
    }
    assert_eq!(crate::engine::gpu::cuda::drafter_kernels_state(), "kernels");
    assert_eq!(crate::engine::gpu::cuda::block_attention_state(), "kernel");
}

/// A probe that marks the phases through a worker's `Marks`, as the drafter worker's does.
struct Marking<'a>(&'a mut crate::engine::pipeline::marks::Marks);

impl StepProbe for Marking<'_> {
    fn mark(&mut self, phase: Phase) {
        self.0.mark(phase);
    }
}

/// `n` real drafter steps of the tiny preset on `dev`, marked through a worker's `Marks`
/// (`extra` sets more flags): their step records.
fn marked_steps(
    dev: Device,
    n: usize,
    extra: impl FnOnce(&mut TrainArgs),
) -> Vec<crate::telemetry::StepRecord> {
    let mut args = TrainArgs {
        preset: Some("tiny".into()),
        ..Default::default()
    };
    extra(&mut args);
    let cfg = RunConfig::from_args(&args)
        .unwrap()
        .apply()
        .unwrap()
        .pipeline;
    let ids = &cfg.drafter_spec.target_layer_ids;
    let (_tvs, target) = build_target(&cfg, &cfg.target_config, ids, dev).unwrap();
    let (vs, model, device) = build_drafters(&cfg, &[dev]).unwrap().remove(0);
    let mut step = DrafterStep {
        model,
        optimizer: AdamW::for_drafter(vs.variables().into_iter().collect(), Default::default()),
        spec: cfg.drafter_spec.clone(),
        embed: frozen_on(&target.embed_tokens, device),
        lm_head: frozen_on(&target.lm_head, device),
        device,
        replicas: Box::new(Single),
        loss_chunk_mib: 1,
        graphs: StepGraphs::off(),
    };
    let telemetry = crate::telemetry::Telemetry::new();
    let rec = telemetry.sink().recorder(
        crate::telemetry::Role::Drafter,
        &crate::engine::pipeline::workers::device_name(dev),
    );
    let switches = telemetry.switches().clone();
    let mut marks = crate::engine::pipeline::marks::Marks::new(rec, dev, switches).unwrap();
    marks.adopt_autograd_calls();
    let counts = std::sync::Arc::new(DataCounts::default());
    let mut source = data_source(&cfg, &cfg.target_config, &cfg.drafter_spec, &counts).unwrap();
    let (mut packer, mut rng) = (Packer::new(), Rng::new(5));
    let mut records = Vec::new();
    for _ in 0..n {
        let b = packer
            .pack(source.as_mut(), cfg.batch, cfg.seq_len)
            .unwrap();
        let b = b.to_device(dev);
        let per_row = rows_anchors(&b, &cfg, &mut rng);
        let hidden = tch::no_grad(|| target.forward(&b.input_ids, &b.positions, &b.doc_ids));
        marks.mark(Phase::Anchors);
        step.run(&hidden, &b, &per_row, 1e-3, &mut Marking(&mut marks))
            .unwrap();
        marks.end_step(b.tokens(), None);
        records.extend(telemetry.records().try_iter().filter(|r| r.steps == 1));
    }
    records
}

/// Issue 28: a real drafter step on the CPU reads the device back exactly once, its figures
/// in `metrics`, and its step record carries that count (a read that skipped the helper, or
/// a new read on the hot path, changes it).
#[test]
fn a_drafter_step_reads_the_device_back_once_in_metrics_and_its_record_says_so() {
    let records = marked_steps(Device::Cpu, 3, |_| {});
    assert_eq!(records.len(), 3);
    for r in records {
        assert_eq!(
            r.host_syncs[Phase::Metrics.index()],
            1,
            "{:?}",
            r.host_syncs
        );
        assert_eq!(r.host_syncs.iter().sum::<u32>(), 1, "{:?}", r.host_syncs);
        assert_eq!(
            r.cuda_calls, None,
            "a CPU step's CUDA calls are not counted"
        );
    }
}

/// Issue 28, on a GPU: with `--cupti on` every drafter step's record carries the kernel
/// launches CUPTI saw on the worker's thread (its forward, loss, clipping, optimizer and
/// metrics) and on libtorch's autograd thread for its device (its backward), and the time in
/// its syncs.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn cupti_counts_each_drafter_steps_kernel_launches_on_cuda() {
    let Some(dev) = crate::engine::gpu::cuda::cuda_or_skip("CUPTI's launch counts") else {
        return;
    };
    let records = marked_steps(dev, 4, |a| {
        a.target_devices = Some("cuda:0".into());
        a.drafter_devices = Some("cuda:0".into());
        a.cupti = Some("on".into());
    });
    assert_eq!(records.len(), 4);
    for r in &records {
        let c = r
            .cuda_calls
            .expect("counted on a CUDA worker with --cupti on");
        eprintln!("drafter step: {c:?}");
        assert!(c.launches > 0 && c.launch_ns > 0, "{c:?}");
        assert!(c.sync_ns > 0, "the metrics read waits in a sync: {c:?}");
    }
}

/// The drafter's weight gradients added into their `.grad` by backward's GEMMs, and an input's
/// gradients from q, k and v (gate and up) summed the same way (through the graphs, as a run
/// takes them), against a copy whose gradients autograd adds after each GEMM (`--disable
/// gemm-grads` on its thread), at 0.6B's shapes: the GEMMs round the sums once where autograd
/// rounds each part, so the two agree to bf16's rounding (the tolerances of the kernels' test
/// above, for the same reasons: on an H100 the norms 0.2% of the largest apart, the weights 2.7%
/// of their move); a gradient written over instead of added (k and v read the context and the
/// block), one lost, or a weight's gradient counted twice (in its GEMM and by autograd) fails
/// it.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn gradients_accumulated_in_their_gemms_train_like_autograds_on_cuda() {
    use crate::engine::gpu::fast_paths::FastPath;
    if !trains_like_the_plain_path("gradients in their GEMMs", FastPath::GemmGrads) {
        return;
    }
    assert_eq!(crate::engine::gpu::cuda::gemm_grads_state(), "gemm");
}
