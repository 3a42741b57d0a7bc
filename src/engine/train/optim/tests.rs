use super::*;

#[test]
fn parameters_keep_their_values_and_every_handle_sees_the_update() {
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let a = vs.root().var("a", &[2, 3], tch::nn::Init::Const(2.0));
    let b = vs.root().var("b", &[4], tch::nn::Init::Const(-1.0));
    let mut opt = AdamW::new(vs.variables().into_iter().collect());
    assert_eq!(
        f64::try_from(a.sum(Kind::Float)).unwrap(),
        12.0,
        "values survive the move"
    );
    assert_eq!(f64::try_from(b.sum(Kind::Float)).unwrap(), -4.0);
    (&a * 3.0).sum(Kind::Float).backward();
    opt.step(0.1);
    // a moved (by lr, Adam's first step), b had a zero gradient and stays.
    let moved = f64::try_from(a.mean(Kind::Float)).unwrap();
    assert!((moved - 1.9).abs() < 1e-4, "{moved}");
    assert_eq!(
        f64::try_from(vs.variables()["a"].mean(Kind::Float)).unwrap(),
        moved
    );
    assert_eq!(f64::try_from(b.sum(Kind::Float)).unwrap(), -4.0);
}

#[test]
fn adamw_minimises_a_quadratic_and_clips() {
    let x = Tensor::from_slice(&[3.0f32, -2.0]).set_requires_grad(true);
    let mut opt = AdamW::new(vec![("x".into(), x.shallow_clone())]);
    for _ in 0..300 {
        (&x * &x).sum(Kind::Float).backward();
        let norm = opt.clip_grad_norm(1.0);
        assert!(f32::try_from(&norm).unwrap() >= 0.0);
        opt.step(0.05);
    }
    let v = Vec::<f32>::try_from(&x).unwrap();
    assert!(v.iter().all(|t| t.abs() < 0.1), "{v:?}");
    assert_eq!(opt.step, 300);
}

/// The fused CUDA step against the plain one on the CPU: the same trajectory (weight decay
/// on, a gated-off step in the middle that must change nothing). Runs where a GPU is (the
/// GPU machine runs this binary); without one it says so.
#[test]
fn gradients_kept_in_the_flat_buffer_train_like_gathered_ones() {
    if !crate::cuda_shim::AVAILABLE {
        eprintln!("no CUDA shim in this build: gradients cannot be attached to a buffer");
        return;
    }
    let run = |flat: bool| {
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let a = vs.root().var("a", &[2, 3], tch::nn::Init::Const(0.5));
        let b = vs.root().var("b", &[4], tch::nn::Init::Const(-1.0));
        let mut opt = AdamW::new(vs.variables().into_iter().collect());
        let buffer = flat.then(|| {
            opt.keep_grads_flat(crate::engine::gpu::cuda::set_grad)
                .unwrap()
        });
        for i in 0..4 {
            let loss = (&a * &a * (i + 1) as f64).sum(Kind::Float) + (&b * 2.0).sum(Kind::Float);
            loss.backward();
            if let Some(buffer) = &buffer {
                // Backward wrote straight into the buffer: a's gradient 2a(i+1), b's 2.
                let g = Vec::<f32>::try_from(buffer).unwrap();
                assert_eq!(g[6..], [2.0; 4], "b's gradient in its span");
                assert!(g[..6].iter().all(|x| *x != 0.0), "{g:?}");
            }
            let _ = opt.clip_grad_norm(10.0);
            opt.step(0.1);
            if let Some(buffer) = &buffer {
                let zero = f64::try_from(buffer.abs().sum(Kind::Double)).unwrap();
                assert_eq!(zero, 0.0, "the step leaves the buffer zeroed");
            }
        }
        Vec::<f32>::try_from(opt.flat_params().shallow_clone()).unwrap()
    };
    assert_eq!(run(true), run(false));
}

/// bf16 working weights against f32 ones fed the same gradients: a loss whose gradients are
/// exact in bf16 (`w * c`, c in bf16) gives both the same gradients, so the masters must
/// follow one trajectory bit for bit, and the working weights must be the masters rounded
/// after every step, through gathered gradients and through a flat bf16 buffer; a save and
/// a load into fresh parameters and a change of the masters round them again.
#[test]
fn bf16_working_weights_follow_f32_ones_fed_the_same_gradients() {
    let c = Tensor::randn([5, 7], (Kind::Float, tch::Device::Cpu)).to_kind(Kind::BFloat16);
    let init = Tensor::randn([5, 7], (Kind::Float, tch::Device::Cpu));
    let dir = tempfile::tempdir().unwrap();
    let build = |working: bool| {
        let w = init.copy().set_requires_grad(true);
        let opt = AdamW::new(vec![("w".into(), w.shallow_clone())]);
        (
            w,
            if working {
                opt.with_bf16_weights()
            } else {
                opt
            },
        )
    };
    for flat in [false, true] {
        if flat && !crate::cuda_shim::AVAILABLE {
            eprintln!("no CUDA shim in this build: gradients cannot be attached to a buffer");
            continue;
        }
        let (w32, mut plain) = build(false);
        let (w16, mut mixed) = build(true);
        assert_eq!(w16.kind(), Kind::BFloat16);
        if flat {
            let buffer = mixed
                .keep_grads_flat(crate::engine::gpu::cuda::set_grad)
                .unwrap();
            assert_eq!(
                buffer.kind(),
                Kind::BFloat16,
                "the gradients' buffer is bf16"
            );
        }
        plain.weight_decay = 0.1;
        mixed.weight_decay = 0.1;
        for i in 0..6 {
            (&w32 * c.to_kind(Kind::Float)).sum(Kind::Float).backward();
            (&w16 * &c).sum(Kind::Float).backward();
            assert_eq!(
                w16.grad().kind(),
                Kind::BFloat16,
                "backward leaves bf16 gradients"
            );
            let _ = plain.clip_grad_norm(2.0);
            let _ = mixed.clip_grad_norm(2.0);
            plain.step(0.05 * (i + 1) as f64);
            mixed.step(0.05 * (i + 1) as f64);
            assert!(
                plain.flat.equal(&mixed.flat),
                "step {i}: the masters differ"
            );
            let rounded = mixed.flat.to_kind(Kind::BFloat16).view([5, 7]);
            assert!(
                w16.equal(&rounded),
                "step {i}: working weights not the masters rounded"
            );
        }
        let moved = f64::try_from((&mixed.flat.view([5, 7]) - &init).abs().max()).unwrap();
        assert!(moved > 0.1, "the steps moved the masters: {moved}");
        let path = dir.path().join(format!("opt-{flat}.safetensors"));
        mixed.save(&path).unwrap();
        let (fresh, mut loaded) = build(true);
        loaded.load(&path).unwrap();
        assert!(
            loaded.flat.equal(&mixed.flat),
            "the masters saved, not the bf16 weights"
        );
        assert!(fresh.equal(&w16), "a load rounds the working weights again");
        loaded
            .change_flat_params(|f| {
                let _ = f.fill_(0.75);
                Ok(())
            })
            .unwrap();
        assert_eq!(f64::try_from(fresh.mean(Kind::Float)).unwrap(), 0.75);
    }
}

/// Our AdamW kernel for bf16 weights, and the path that stands in for it (`widened_adamw`),
/// against libtorch's fused AdamW over the same gradients widened to f32: the masters and
/// moments within float rounding, the working weights the masters rounded, over steps with
/// clipping and weight decay, a gated-off step (which must change nothing), steps with
/// neither, and a length of several blocks of threads with a tail of fewer than four.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn bf16_adamw_kernel_follows_libtorchs_fused_step_on_cuda() {
    let Some(dev) = crate::engine::gpu::cuda::cuda_or_skip("the AdamW kernel for bf16 weights")
    else {
        return;
    };
    let n = 4 * 1024 + 3;
    let master = Tensor::randn([n], FLOAT_CPU).to_device(dev);
    let zeros = Tensor::zeros([n], (Kind::Float, dev));
    let state = || [master.copy(), zeros.copy(), zeros.copy()];
    // The kernel's, the stand-in's, libtorch's.
    let (ours, widened, theirs) = (state(), state(), state());
    let (work, widened_work) = (
        master.to_kind(Kind::BFloat16),
        master.to_kind(Kind::BFloat16),
    );
    let hyper = crate::engine::gpu::cuda::AdamWHyper {
        lr: 0.01,
        beta1: 0.9,
        beta2: 0.999,
        weight_decay: 0.1,
        eps: 1e-8,
    };
    for i in 1..=8 {
        // Drawn on the CPU: a graph captured by a test beside this one holds the device's
        // generator.
        let g = Tensor::randn([n], FLOAT_CPU)
            .to_device(dev)
            .to_kind(Kind::BFloat16);
        let scale = Tensor::full([], 1.0 + i as f64 / 4.0, (Kind::Float, dev));
        let inf = Tensor::full([], if i == 5 { 1.0 } else { 0.0 }, (Kind::Float, dev));
        // The last two steps without a clip or a gate.
        let (scale, inf) = if i > 6 {
            (None, None)
        } else {
            (Some(&scale), Some(&inf))
        };
        let before = ours[0].copy();
        let (moments, at) = ((&ours[1], &ours[2]), (&hyper, i as f64));
        crate::engine::gpu::cuda::adamw_bf16((&ours[0], &g), moments, &work, at, scale, inf)
            .unwrap();
        let moments = (&widened[1], &widened[2]);
        let ran = widened_adamw((&widened[0], &g), moments, &widened_work, at, scale, inf);
        assert!(ran, "libtorch's fused AdamW ran under the stand-in");
        let step = Tensor::full([], i as f64, (Kind::Float, dev));
        let state = crate::engine::gpu::cuda::AdamWState {
            param: &theirs[0],
            grad: &g.to_kind(Kind::Float),
            m: &theirs[1],
            v: &theirs[2],
            step: &step,
        };
        crate::engine::gpu::cuda::fused_adamw(&state, &hyper, scale, inf).unwrap();
        if i == 5 {
            assert!(
                ours[0].equal(&before),
                "a gated-off step changed the masters"
            );
        }
        for (a, b) in ours.iter().chain(&widened).zip(theirs.iter().cycle()) {
            let diff = f64::try_from((a - b).abs().max()).unwrap();
            let size = f64::try_from(b.abs().max()).unwrap();
            assert!(diff <= 1e-6 * size.max(1e-3), "step {i}: {diff} of {size}");
        }
        for (w, m) in [(&work, &ours[0]), (&widened_work, &widened[0])] {
            assert!(
                w.equal(&m.to_kind(Kind::BFloat16)),
                "step {i}: working weights"
            );
        }
    }
    let moved = f64::try_from((&ours[0] - &master).abs().max()).unwrap();
    assert!(moved > 0.01, "the steps moved the masters: {moved}");
}

const FLOAT_CPU: (Kind, tch::Device) = (Kind::Float, tch::Device::Cpu);

#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn fused_cuda_adamw_follows_the_plain_one() {
    if crate::engine::gpu::cuda::cuda_or_skip("the fused AdamW step").is_none() {
        return;
    }
    let start = Tensor::randn([1000], (Kind::Float, tch::Device::Cpu));
    let run = |device: tch::Device| {
        let x = start.to_device(device).copy().set_requires_grad(true);
        let mut opt = AdamW::new(vec![("x".into(), x.shallow_clone())]);
        opt.weight_decay = 0.1;
        for i in 0..20 {
            (&x * &x * 0.5 + x.sin()).sum(Kind::Float).backward();
            let _ = opt.clip_grad_norm(1.0);
            let ok = Tensor::from(i != 7).to_device(device);
            opt.step_if(0.01, &ok);
        }
        x.detach().to_device(tch::Device::Cpu)
    };
    let (plain, fused) = (run(tch::Device::Cpu), run(tch::Device::Cuda(0)));
    let diff = f64::try_from((&plain - &fused).abs().max()).unwrap();
    let moved = f64::try_from((&plain - &start).abs().max()).unwrap();
    assert!(moved > 0.05, "the steps moved the weights: {moved}");
    assert!(diff < 1e-5, "fused and plain AdamW differ by {diff}");
}

/// The state file's `step`: saved and loaded back, taken as a scalar too, and refused with a
/// sentence naming the file where it is not a single count (no panic, no silent zero).
#[test]
fn the_saved_step_loads_back_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("optimizer.safetensors");
    let w = Tensor::ones([2, 3], (Kind::Float, tch::Device::Cpu));
    let mut opt = AdamW::new(vec![("w".into(), w)]);
    opt.step = 41;
    opt.save(&path).unwrap();
    let fresh = || {
        AdamW::new(vec![(
            "w".into(),
            Tensor::zeros([2, 3], tch::kind::FLOAT_CPU),
        )])
    };
    let mut loaded = fresh();
    loaded.load(&path).unwrap();
    assert_eq!(loaded.step, 41);
    let saved: Vec<(String, Tensor)> = Tensor::read_safetensors(&path).unwrap();
    let with_step = |step: Tensor| {
        let mut named: Vec<(String, Tensor)> = saved
            .iter()
            .filter(|(n, _)| n != "step")
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        named.push(("step".into(), step));
        Tensor::write_safetensors(&named, &path).unwrap();
    };
    with_step(Tensor::from(7i64));
    let mut scalar = fresh();
    scalar.load(&path).unwrap();
    assert_eq!(scalar.step, 7);
    with_step(Tensor::from_slice(&[1i64, 2, 3]));
    let err = format!("{:#}", fresh().load(&path).unwrap_err());
    assert!(
        err.contains(&path.display().to_string()) && err.contains("lacks `step`"),
        "{err}"
    );
    // A file cut short: refused at open, the file named once with the way out.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let err = format!("{:#}", fresh().load(&path).unwrap_err());
    assert_eq!(err.matches(&path.display().to_string()).count(), 1, "{err}");
    assert!(
        err.contains("not a readable optimizer state") && err.contains("--drafter"),
        "{err}"
    );
}
