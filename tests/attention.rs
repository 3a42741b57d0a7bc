//! The drafter's tiled attention against the dense block mask: the same visible keys, so the
//! same outputs and gradients (float tolerance), with two documents per row, padding anchors
//! and several tiles.

use dflash_top::engine::blocks::{block_mask, block_positions, tiled_block_mask, Anchors};
use dflash_top::engine::config::Preset;
use dflash_top::engine::drafter::Drafter;
use dflash_top::engine::tiled::{padded_width, tile_anchors, AttnMask};
use tch::{nn::VarStore, Device, Kind, Tensor};

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    f64::try_from((a - b).abs().max()).unwrap()
}

#[test]
fn tiles_divide_the_anchor_count() {
    assert_eq!(tile_anchors(512), 32);
    assert_eq!(tile_anchors(64), 32);
    assert_eq!(tile_anchors(16), 16);
    assert_eq!(tile_anchors(48), 24);
    assert_eq!(tile_anchors(37), 1);
    // Per-document anchors vary per batch: the width is padded to whole tiles.
    assert_eq!(padded_width(0), 1);
    assert_eq!(padded_width(13), 13);
    assert_eq!(padded_width(37), 64);
    assert_eq!(tile_anchors(padded_width(1500) as i64), 32);
}

#[test]
fn tiled_attention_equals_the_dense_mask_forward_and_backward() {
    tch::manual_seed(7);
    let p = Preset::by_name("tiny").unwrap();
    let spec = p.drafter_spec(&p.target);
    let c = &spec.layers;
    let (b, s, a, block) = (2i64, 48i64, 64i64, 4i64);
    // Row 0: documents of 20 and 28 tokens; row 1: one document of 30 and 18 padding tokens.
    let mut doc = vec![0i64; 20];
    doc.extend(vec![1; 28]);
    doc.extend(vec![0; 30]);
    doc.extend(vec![1; 18]);
    let docs = Tensor::from_slice(&doc).view([b, s]);
    let pos_rows: Vec<i64> = (0..20).chain(0..28).chain(0..30).chain(0..18).collect();
    let pos = Tensor::from_slice(&pos_rows).view([b, s]);
    // 64 anchors a row (two tiles of 32); the last 10 of row 1 are padding.
    let anchor_pos: Vec<i64> = (0..b * a).map(|i| (i * 7 + 3) % (s - block)).collect();
    let valid: Vec<bool> = (0..b * a).map(|i| !(i >= a && i % a >= a - 10)).collect();
    let anchors = Anchors {
        pos: Tensor::from_slice(&anchor_pos).view([b, a]),
        valid: Tensor::from_slice(&valid).view([b, a]),
        count: valid.iter().filter(|v| **v).count(),
    };
    let tiled = tiled_block_mask(&docs, &anchors, block);
    assert_eq!(tiled.tile, 32 * block);
    let dense = block_mask(&docs, &anchors, block);
    assert!(
        AttnMask::Tiled(tiled_block_mask(&docs, &anchors, block))
            .dense()
            .equal(&dense),
        "the tiles hold exactly the dense mask"
    );

    let vs = VarStore::new(Device::Cpu);
    let mut spec = spec.clone();
    spec.block_size = block;
    let drafter = Drafter::new(&vs.root(), &spec);
    let n_feat = spec.target_layer_ids.len() as i64;
    let hidden = Tensor::randn([b, s, n_feat * c.hidden_size], (Kind::Float, Device::Cpu));
    let emb = Tensor::randn([b, a * block, c.hidden_size], (Kind::Float, Device::Cpu));
    let bpos = block_positions(&pos, &anchors, block);
    let run = |mask: &AttnMask| {
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let out = drafter.forward_masked(&hidden, &pos, &emb, &bpos, mask);
        (&out * &out).sum(Kind::Float).backward();
        let grads: Vec<Tensor> = vs
            .trainable_variables()
            .iter()
            .map(|v| v.grad().copy())
            .collect();
        (out.detach(), grads)
    };
    let (out_dense, g_dense) = run(&AttnMask::Dense(dense));
    let (out_tiled, g_tiled) = run(&AttnMask::Tiled(tiled));
    assert!(bool::try_from(out_tiled.isfinite().all()).unwrap());
    let d = max_diff(&out_dense, &out_tiled);
    assert!(d < 1e-4, "outputs differ by {d}");
    assert!(g_dense.len() > 5);
    for (x, y) in g_dense.iter().zip(&g_tiled) {
        let scale = f64::try_from(x.abs().max()).unwrap().max(1.0);
        let d = max_diff(x, y) / scale;
        assert!(d < 1e-4, "gradients differ by {d} (relative)");
    }
}
