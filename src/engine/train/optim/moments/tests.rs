use super::super::AdamW;
use super::*;

const CPU: tch::Device = tch::Device::Cpu;

/// The ops draw the kernel's noise: the same hash as a host computation of it (wrapping u32
/// arithmetic, as CUDA's), below 2^32 and across it (where the index's high half counts).
#[test]
fn the_ops_draw_the_same_noise_as_the_hash_written_out() {
    for offset in [0_i64, (1 << 32) - 300] {
        for key in [0, 1, noise_key(12_345, 1)] {
            let ops = noise_for_tests(offset, 600, key);
            for (i, got) in ops.iter().enumerate() {
                let want = noise_host((offset + i as i64) as u64, key);
                assert_eq!(*got, want as i64, "index {} key {key}", offset + i as i64);
            }
        }
    }
    let a = noise_for_tests(0, 1000, 7);
    let distinct: std::collections::BTreeSet<_> = a.iter().map(|r| r & 0xffff).collect();
    assert!(
        distinct.len() > 950,
        "noise repeats: {} of 1000",
        distinct.len()
    );
}

/// A value between two bf16 neighbours rounds up as often as its distance from the lower one
/// says (an eighth of the way: an eighth of the time), of either sign; values bf16 holds stay;
/// the same key rounds alike, another key otherwise; infinities and NaN round to nearest.
#[test]
fn stochastic_rounding_is_unbiased_and_keeps_what_bf16_holds() {
    let n = 1 << 16;
    for sign in [1.0, -1.0] {
        let x = Tensor::full([n], sign * (1.0 + 2f64.powi(-10)), (Kind::Float, CPU));
        let r = round_stochastic(&x, 3, 0).to_kind(Kind::Float);
        let ups = f64::try_from(r.abs().gt(1.0).to_kind(Kind::Double).mean(Kind::Double)).unwrap();
        assert!((ups - 0.125).abs() < 0.01, "rounded up {ups} of the time");
        let lows = r.abs().eq(1.0).logical_or(&r.abs().eq(1.0 + 2f64.powi(-7)));
        assert!(
            bool::try_from(lows.all()).unwrap(),
            "only the two neighbours"
        );
        let mean = f64::try_from(r.mean(Kind::Double)).unwrap();
        let want = sign * (1.0 + 2f64.powi(-10));
        assert!((mean - want).abs() < 2e-4, "mean {mean} against {want}");
        assert!(r.equal(&round_stochastic(&x, 3, 0).to_kind(Kind::Float)));
        assert!(!r.equal(&round_stochastic(&x, 4, 0).to_kind(Kind::Float)));
    }
    let held = Tensor::randn([4096], (Kind::Float, CPU)).to_kind(Kind::BFloat16);
    assert!(round_stochastic(&held.to_kind(Kind::Float), 9, 0).equal(&held));
    let odd = Tensor::from_slice(&[f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 0.0]);
    let r = Vec::<f32>::try_from(round_stochastic(&odd, 1, 0).to_kind(Kind::Float)).unwrap();
    assert_eq!(r[..2], [f32::INFINITY, f32::NEG_INFINITY]);
    assert!(r[2].is_nan());
    assert_eq!(r[3], 0.0);
}

/// A drafter-sized step pattern that rounding to nearest cannot follow: after one gradient,
/// steps without one must decay v by beta2 each (0.1%, under half of bf16's spacing), and
/// stochastic rounding must follow f32 moments there; the masters too.
#[test]
fn bf16_moments_decay_where_rounding_to_nearest_would_stall() {
    let n = 4096;
    let init = Tensor::randn([n], (Kind::Float, CPU));
    let run = |moments: MomentPrecision| {
        let w = init.copy().set_requires_grad(true);
        let mut opt = AdamW::new(vec![("w".into(), w.shallow_clone())]).with_moments(moments);
        (&w * 0.5).sum(Kind::Float).backward();
        opt.step(0.01);
        for _ in 0..400 {
            opt.step(0.01);
        }
        let v = f64::try_from(opt.v.to_kind(Kind::Double).mean(Kind::Double)).unwrap();
        (v, opt.flat.copy())
    };
    let (v32, w32) = run(MomentPrecision::F32);
    let (v16, w16) = run(MomentPrecision::Bf16);
    let want = 0.25 * 0.001 * 0.999f64.powi(400);
    assert!(
        (v32 - want).abs() < 1e-3 * want,
        "f32: {v32} against {want}"
    );
    assert!(
        (v16 - want).abs() < 0.01 * want,
        "bf16: {v16} against {want}"
    );
    // The premise: rounded to nearest, one decay step leaves v where it was.
    let v1 = Tensor::from(0.25f32 * 0.001).to_kind(Kind::BFloat16);
    let decayed = (v1.to_kind(Kind::Float) * 0.999).to_kind(Kind::BFloat16);
    assert!(decayed.equal(&v1), "rounding to nearest would move v");
    let drift = f64::try_from((&w16 - &w32).abs().max()).unwrap();
    let moved = f64::try_from((&w32 - &init).abs().max()).unwrap();
    assert!(moved > 0.03, "the steps moved the masters: {moved}");
    assert!(
        drift < 0.02 * moved,
        "bf16 moments drift {drift} of {moved}"
    );
}

/// The noise is keyed by the step, so a run saved and resumed takes the same steps as one that
/// went straight on, to the bit (its moments saved in bf16), through gated-off steps too; a
/// state of f32 moments loads into bf16 ones (rounded).
#[test]
fn bf16_moments_resume_to_the_bit_and_load_f32_states() {
    let init = Tensor::randn([300], (Kind::Float, CPU));
    let grads: Vec<Tensor> = (0..10)
        .map(|_| Tensor::randn([300], (Kind::Float, CPU)))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let fresh = |moments| {
        let w = init.copy().set_requires_grad(true);
        let opt = AdamW::new(vec![("w".into(), w.shallow_clone())]).with_moments(moments);
        (w, opt)
    };
    let steps = |w: &Tensor, opt: &mut AdamW, range: std::ops::Range<usize>| {
        for i in range {
            (w * &grads[i]).sum(Kind::Float).backward();
            let _ = opt.clip_grad_norm(5.0);
            opt.step_if(0.01 * (i + 1) as f64, &Tensor::from(i != 3));
        }
    };
    let (w, mut straight) = fresh(MomentPrecision::Bf16);
    steps(&w, &mut straight, 0..10);
    let (w, mut first) = fresh(MomentPrecision::Bf16);
    steps(&w, &mut first, 0..6);
    let path = dir.path().join("opt.safetensors");
    first.save(&path).unwrap();
    let saved: std::collections::HashMap<_, _> = Tensor::read_safetensors(&path)
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(saved["exp_avg_sq.w"].kind(), Kind::BFloat16);
    let (w, mut resumed) = fresh(MomentPrecision::Bf16);
    resumed.load(&path).unwrap();
    resumed.step = first.step;
    steps(&w, &mut resumed, 6..10);
    assert!(
        resumed.flat.equal(&straight.flat),
        "masters differ after resume"
    );
    assert!(resumed.m.equal(&straight.m) && resumed.v.equal(&straight.v));
    let moved = f64::try_from((&straight.flat - &init).abs().max()).unwrap();
    assert!(moved > 0.01, "the steps moved the masters: {moved}");

    let (w, mut wide) = fresh(MomentPrecision::F32);
    steps(&w, &mut wide, 0..6);
    wide.save(&path).unwrap();
    let (_, mut narrow) = fresh(MomentPrecision::Bf16);
    narrow.load(&path).unwrap();
    assert_eq!(narrow.v.kind(), Kind::BFloat16);
    assert!(narrow.v.equal(&wide.v.to_kind(Kind::BFloat16)));
}

/// The plain step with bf16 moments goes a span at a time: spans of 7 elements step as one
/// span of all 300 does, to the bit (each element's noise is its index in the buffer's), through
/// weight decay, clipping and a gated-off step.
#[test]
fn bf16_moments_step_alike_in_spans_of_any_length() {
    let init = Tensor::randn([300], (Kind::Float, CPU));
    let run = |span: i64| {
        let w = init.copy().set_requires_grad(true);
        let mut opt =
            AdamW::new(vec![("w".into(), w.shallow_clone())]).with_moments(MomentPrecision::Bf16);
        opt.span_elements = span;
        opt.weight_decay = 0.1;
        for i in 0..6 {
            (&w * &w * (i + 1) as f64).sum(Kind::Float).backward();
            let _ = opt.clip_grad_norm(3.0);
            opt.step_if(0.02, &Tensor::from(i != 2));
        }
        (opt.flat.copy(), opt.m.copy(), opt.v.copy())
    };
    let (whole, spans) = (run(1 << 24), run(7));
    assert!(whole.0.equal(&spans.0), "the masters differ");
    assert!(
        whole.1.equal(&spans.1) && whole.2.equal(&spans.2),
        "the moments differ"
    );
    let moved = f64::try_from((&whole.0 - &init).abs().max()).unwrap();
    assert!(moved > 0.01, "the steps moved the masters: {moved}");
}

/// Our kernel with bf16 moments against the plain path's ops on the same GPU: the moments
/// within two bf16 steps (the f32 values they round from may differ in their last bit) and
/// mostly equal, the masters within float rounding but where a moment rounded apart, the
/// working weights the masters rounded, a gated-off step changing nothing, over a length of
/// several blocks of threads and a tail.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn the_kernel_with_bf16_moments_follows_the_ops_on_cuda() {
    let Some(dev) = crate::engine::gpu::cuda::cuda_or_skip("the AdamW kernel with bf16 moments")
    else {
        return;
    };
    let n = 4 * 1024 + 3;
    let init = Tensor::randn([n], (Kind::Float, CPU)).to_device(dev);
    let build = |fused: bool| {
        let w = init.copy().set_requires_grad(true);
        let mut opt = AdamW::new(vec![("w".into(), w.shallow_clone())])
            .with_moments(MomentPrecision::Bf16)
            .with_bf16_weights();
        opt.fused_step = fused;
        opt.weight_decay = 0.1;
        opt
    };
    let (mut kernel, mut ops) = (build(true), build(false));
    for i in 0..8 {
        let c = Tensor::randn([n], (Kind::Float, CPU))
            .to_device(dev)
            .to_kind(Kind::BFloat16);
        let ok = Tensor::from(i != 5).to_device(dev);
        let before = (kernel.flat.copy(), kernel.m.copy(), kernel.v.copy());
        for opt in [&mut kernel, &mut ops] {
            (&opt.params[0].1 * &c).sum(Kind::Float).backward();
            let _ = opt.clip_grad_norm(20.0);
            opt.step_if(0.01, &ok);
        }
        assert_eq!(super::super::bf16_kernel_state(), "kernel");
        if i == 5 {
            assert!(
                kernel.flat.equal(&before.0),
                "a gated-off step moved the masters"
            );
            assert!(kernel.m.equal(&before.1) && kernel.v.equal(&before.2));
        }
        // A moment rounded a bf16 step apart moves its master by up to 1% of a step (0.01 at
        // this lr): the masters agree to float rounding but where that happened.
        let gap = (&kernel.flat - &ops.flat).abs();
        let worst = f64::try_from(gap.max()).unwrap();
        assert!(worst < 1e-3, "step {i}: masters differ by {worst}");
        let apart = f64::try_from(gap.gt(1e-5).to_kind(Kind::Double).mean(Kind::Double));
        assert!(apart.unwrap() < 0.02, "step {i}: masters apart too often");
        for (a, b) in [(&kernel.m, &ops.m), (&kernel.v, &ops.v)] {
            let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
            // Two bf16 steps: a moment rounded apart carries its step into the next rounding;
            // near zero, a float step of the terms that cancel there.
            let scale = f64::try_from(b.abs().max()).unwrap();
            let gap = (&a - &b).abs() - b.abs() * 2f64.powi(-6) - 1e-6 * scale;
            let worst = f64::try_from(gap.max()).unwrap();
            assert!(
                worst <= 0.0,
                "step {i}: moments more than two bf16 steps apart"
            );
            let same = f64::try_from(a.eq_tensor(&b).to_kind(Kind::Double).mean(Kind::Double));
            assert!(
                same.unwrap() > 0.99,
                "step {i}: moments rounded apart too often"
            );
        }
        let work = kernel.working.as_ref().unwrap();
        assert!(work.equal(&kernel.flat.to_kind(Kind::BFloat16)));
    }
    let moved = f64::try_from((&kernel.flat - &init).abs().max()).unwrap();
    assert!(moved > 0.01, "the steps moved the masters: {moved}");
}
