//! Tests of the NCCL path of drafter data parallel (src/engine/parallel/nccl.rs): bucket planning on the
//! CPU, the process groups on GPUs.

use super::*;

/// Gradients reduced bucket by bucket during backward, at world size 1 (the mean of one is
/// itself): the buffer ends equal to the gradients plain autograd computes, with f32 weights
/// and with bf16 weights beside f32 masters (a drafter's on a GPU: bf16 gradient buckets).
#[test]
fn bucketed_reduction_on_cuda_leaves_the_true_gradients() {
    if !tch::Cuda::is_available() || !AVAILABLE {
        eprintln!("no CUDA device (or no NCCL shim in this build): not run");
        return;
    }
    let dev = tch::Device::Cuda(0);
    // One set of starting weights for both copies (drawn once: tests running beside this
    // one draw from the same generator).
    let init: Vec<Tensor> = (0..4)
        .map(|_| Tensor::randn([64, 64], (tch::Kind::Float, tch::Device::Cpu)) * 0.1)
        .collect();
    let build = || {
        let vs = tch::nn::VarStore::new(dev);
        let root = vs.root();
        let on = |i: usize| init[i].to_device(dev);
        let ws = vec![
            root.var_copy("fc", &on(0)),
            (&root / "layers" / 0).var_copy("w", &on(1)),
            (&root / "layers" / 1).var_copy("w", &on(2)),
            root.var_copy("norm", &on(3)),
        ];
        (vs, ws)
    };
    let loss = |ws: &[Tensor], x: &Tensor| {
        // fc first, the layers, the norm last: backward runs them the other way round.
        let mut h = x.matmul(&ws[0]).tanh();
        for w in &ws[1..] {
            h = h.matmul(w).tanh();
        }
        h.pow_tensor_scalar(2).sum(tch::Kind::Float)
    };
    for kind in [tch::Kind::Float, tch::Kind::BFloat16] {
        let x = Tensor::randn([16, 64], (tch::Kind::Float, tch::Device::Cpu))
            .to_device(dev)
            .to_kind(kind);
        let optimizer = |vs: &tch::nn::VarStore| {
            let opt = AdamW::new(vs.variables().into_iter().collect());
            if kind == tch::Kind::BFloat16 {
                opt.with_bf16_weights()
            } else {
                opt
            }
        };
        let (plain_vs, plain_ws) = build();
        let mut plain = optimizer(&plain_vs);
        let (vs, ws) = build();
        let mut opt = optimizer(&vs);
        let group = NcclGroup::new(1).unwrap();
        let mut member = group.member(0);
        member.prepare(&mut opt).unwrap();
        assert!(!member.reducer.is_null(), "buckets hooked into backward");
        for _ in 0..2 {
            loss(&plain_ws, &x).backward();
            let want = plain.gathered_grads().copy();
            loss(&ws, &x).backward();
            member.mean(&mut opt).unwrap();
            let got = opt.gathered_grads().copy();
            assert_eq!(got.kind(), kind, "gradients of the weights' kind");
            let diff = f64::try_from((&got - &want).abs().max()).unwrap();
            assert!(diff < 1e-5, "{kind:?}: bucketed gradients differ by {diff}");
            plain.step(0.01);
            opt.step(0.01);
        }
    }
}

#[test]
fn buckets_follow_backward_layer_by_layer_and_cover_every_parameter_once() {
    // The optimizer's order: names sorted, so layers.10 sits between layers.1 and layers.2.
    let names = [
        "fc.weight",
        "hidden_norm.weight",
        "layers.0.mlp.weight",
        "layers.0.norm.weight",
        "layers.1.mlp.weight",
        "layers.10.mlp.weight",
        "layers.2.mlp.weight",
        "norm.weight",
    ];
    let sizes = [8, 2, 5, 1, 5, 5, 5, 2];
    let mut off = 0;
    let layout: Vec<(&str, (i64, i64))> = names
        .iter()
        .zip(sizes)
        .map(|(n, s)| {
            let span = (off, s);
            off += s;
            (*n, span)
        })
        .collect();
    let buckets = plan_buckets(&layout);
    let params: Vec<Vec<usize>> = buckets.iter().map(|b| b.params.clone()).collect();
    assert_eq!(
        params,
        vec![vec![5], vec![6], vec![4], vec![2, 3], vec![0, 1, 7]],
        "layer 10, 2, 1, 0, then the rest"
    );
    assert_eq!(buckets[3].spans, vec![(10, 6)], "a layer's spans merge");
    assert_eq!(
        buckets[4].spans,
        vec![(0, 10), (31, 2)],
        "fc + hidden_norm merge; the final norm is a span of its own"
    );
    let covered: i64 = buckets.iter().flat_map(|b| &b.spans).map(|s| s.1).sum();
    assert_eq!(covered, off, "every element in exactly one span");
}
