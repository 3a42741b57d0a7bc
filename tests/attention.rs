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

#[test]
fn documents_split_at_id_changes_and_row_ends() {
    use dflash_top::engine::varlen::Varlen;
    // Row 0: documents of 3 and 2 tokens; row 1: 4 tokens of one document, then 1 of padding.
    // Row 1's first document has the id row 0's last one had: the row end still splits them.
    let ids = [0i64, 0, 0, 1, 1, 1, 1, 1, 1, 2];
    let v = Varlen::from_doc_ids(&ids, 5, Device::Cpu);
    assert_eq!(
        Vec::<i32>::try_from(&v.cu_seqlens).unwrap(),
        vec![0, 3, 5, 9, 10]
    );
    assert_eq!(v.max_len, 4);
}

/// The target's flash path (causal varlen kernel, no mask tensor) against the dense
/// document-causal mask, on CUDA in bf16: two documents in a row, a padded row, a sliding layer.
/// Runs where a GPU is (the GPU machine runs this binary); on a machine without one it says so.
#[test]
fn flash_target_equals_the_dense_document_mask_on_cuda() {
    use dflash_top::engine::qwen3::Qwen3Target;
    use dflash_top::engine::varlen::Varlen;
    if !tch::Cuda::is_available() || !dflash_top::engine::cuda::AVAILABLE {
        eprintln!("no CUDA device (or no CUDA shim in this build): the flash path is not run here");
        return;
    }
    let dev = Device::Cuda(0);
    tch::manual_seed(3);
    let p = Preset::by_name("tiny").unwrap();
    let mut cfg = p.target.clone();
    cfg.layer_types = Some(
        (0..cfg.num_hidden_layers)
            .map(|i| {
                if i == 1 {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
                .to_string()
            })
            .collect(),
    );
    cfg.sliding_window = Some(7);
    let mut vs = VarStore::new(dev);
    let target = Qwen3Target::new(&vs.root(), &cfg, &[1, 3, 5], 0.5);
    vs.bfloat16();
    let (b, s) = (2i64, 64i64);
    let lengths = [vec![40i64, 24], vec![50, 14]];
    let mut docs = Vec::new();
    let mut pos = Vec::new();
    for row in &lengths {
        for (d, &len) in row.iter().enumerate() {
            docs.extend(std::iter::repeat_n(d as i64, len as usize));
            pos.extend(0..len);
        }
    }
    let ids = Tensor::randint(500, [b, s], (Kind::Int64, dev));
    let doc_t = Tensor::from_slice(&docs).view([b, s]).to_device(dev);
    let pos_t = Tensor::from_slice(&pos).view([b, s]).to_device(dev);
    let dense = tch::no_grad(|| target.forward(&ids, &pos_t, &doc_t)).to_kind(Kind::Float);
    let varlen = Varlen::from_doc_ids(&docs, s as usize, dev);
    let flash =
        tch::no_grad(|| target.forward_documents(&ids, &pos_t, &varlen)).to_kind(Kind::Float);
    let scale = f64::try_from(dense.abs().max()).unwrap();
    let diff = max_diff(&dense, &flash);
    eprintln!("flash vs dense target hidden states: max |diff| {diff:.4} of max |x| {scale:.2}");
    assert!(
        diff <= 0.02 * scale,
        "flash differs from dense: {diff} (scale {scale})"
    );
    // Not trivially equal: dropping the documents (one causal sequence a row) changes them.
    let one_doc = Varlen::from_doc_ids(&vec![0i64; (b * s) as usize], s as usize, dev);
    let wrong =
        tch::no_grad(|| target.forward_documents(&ids, &pos_t, &one_doc)).to_kind(Kind::Float);
    assert!(
        max_diff(&dense, &wrong) > 10.0 * diff.max(1e-3),
        "the documents must matter"
    );
}
