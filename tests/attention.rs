//! The drafter's tiled attention against the dense block mask: the same visible keys, so the
//! same outputs and gradients (float tolerance). Packed rows of several documents, anchors at
//! document starts, padding anchors and whole tiles of padding, rows whose tiles have different
//! context windows, and a window that spans the whole context.

use dflash_top::engine::model::drafter::Drafter;
use dflash_top::engine::model::layers::masked_attention;
use dflash_top::engine::model::tiled::{
    context_spans, padded_width, plan_runs, tile_anchors, tiled_attention, window_grid, AttnMask,
    Span, TiledMask, WindowPlan,
};
use dflash_top::engine::train::blocks::{
    anchors_tensor, block_mask, block_positions, block_spans, context_mask, tiled_block_mask,
    Anchors,
};
use dflash_top::engine::train::presets::Preset;
use tch::{nn::VarStore, Device, Kind, Tensor};

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    f64::try_from((a - b).abs().max()).unwrap()
}

/// Random queries, keys and values (leaves) for the fixture's shapes, and the gradient that
/// comes back into the attention's output.
struct Qkv {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    upstream: Tensor,
}

impl Qkv {
    // q [b, hq, lq, d], k/v [b, hkv, s + lq, d]
    fn new(f: &Fixture, (hq, hkv, d): (i64, i64, i64), kind: Kind, dev: Device) -> Qkv {
        let (b, lq) = (f.docs.size()[0], f.anchors.pos.size()[1] * f.block);
        let rand = |h: i64, l: i64| Tensor::randn([b, h, l, d], (kind, dev));
        Qkv {
            q: rand(hq, lq).set_requires_grad(true),
            k: rand(hkv, f.s + lq).set_requires_grad(true),
            v: rand(hkv, f.s + lq).set_requires_grad(true),
            upstream: rand(hq, lq),
        }
    }

    /// The output and the gradients to q, k and v (in f32) of one attention.
    fn run(&self, attend: impl Fn(&Tensor, &Tensor, &Tensor) -> Tensor) -> [Tensor; 4] {
        for x in [&self.q, &self.k, &self.v] {
            let mut g = x.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let out = attend(&self.q, &self.k, &self.v);
        (&out * &self.upstream).sum(Kind::Float).backward();
        [out.detach(), self.q.grad(), self.k.grad(), self.v.grad()]
            .map(|x| x.to_kind(Kind::Float).copy())
    }
}

/// The anchors of each row as the host holds them, read back from `anchors` (its valid anchors
/// lead each row, as `anchors_tensor` pads them).
pub fn host_rows(anchors: &Anchors) -> Vec<Vec<i64>> {
    let width = anchors.pos.size()[1] as usize;
    let pos = Vec::<i64>::try_from(anchors.pos.flatten(0, -1)).unwrap();
    let valid = Vec::<bool>::try_from(anchors.valid.flatten(0, -1)).unwrap();
    pos.chunks(width)
        .zip(valid.chunks(width))
        .map(|(p, v)| {
            assert!(v.windows(2).all(|w| w[0] || !w[1]), "padding trails a row");
            p.iter()
                .zip(v)
                .filter(|(_, v)| **v)
                .map(|(p, _)| *p)
                .collect()
        })
        .collect()
}

/// Four packed rows of 96 tokens, 64 anchors a row (two tiles of 32), blocks of 4:
/// - row 0: documents of 30, 40 and 26 tokens; anchors at the three starts and every odd
///   position (51): its tiles' windows start at document 0 and at document 1;
/// - row 1: a document of 60, then 36 of padding (an id of its own); 12 anchors: its second
///   tile is all padding;
/// - row 2: one document; 32 anchors up to 93: the first tile's window is the whole context;
/// - row 3: three documents of 32; 33 anchors, the last one alone in its tile at a document's
///   start (a valid block that sees no context).
struct Fixture {
    docs: Tensor,
    host_docs: Vec<i64>,
    pos: Tensor,
    per_row: Vec<Vec<i64>>,
    anchors: Anchors,
    s: i64,
    block: i64,
}

fn fixture() -> Fixture {
    let (s, block, width) = (96i64, 4i64, 64usize);
    let lengths: [&[i64]; 4] = [&[30, 40, 26], &[60, 36], &[96], &[32, 32, 32]];
    let mut host_docs = Vec::new();
    let mut pos = Vec::new();
    for row in lengths {
        for (d, &len) in row.iter().enumerate() {
            host_docs.extend(std::iter::repeat_n(d as i64, len as usize));
            pos.extend(0..len);
        }
    }
    let mut row0: Vec<i64> = (0..s).filter(|p| p % 2 == 1).chain([0, 30, 70]).collect();
    row0.sort_unstable();
    let per_row = vec![
        row0,
        std::iter::once(0).chain((2..56).step_by(5)).collect(),
        (0..s).step_by(3).collect(),
        (1..64).step_by(2).chain([64]).collect(),
    ];
    assert_eq!(
        per_row.iter().map(Vec::len).collect::<Vec<_>>(),
        [51, 12, 32, 33]
    );
    let b = lengths.len() as i64;
    Fixture {
        docs: Tensor::from_slice(&host_docs).view([b, s]),
        pos: Tensor::from_slice(&pos).view([b, s]),
        anchors: anchors_tensor(&per_row, width, Device::Cpu),
        host_docs,
        per_row,
        s,
        block,
    }
}

impl Fixture {
    fn spans(&self) -> Vec<Span> {
        let width = self.anchors.pos.size()[1] as usize;
        context_spans(&self.per_row, width, &self.host_docs, self.s as usize)
    }

    fn plan(&self, spans: &[Span], grid: i64) -> WindowPlan {
        WindowPlan::from_spans(spans, self.per_row.len(), grid, self.s)
    }

    fn tiled(&self, spans: &[Span], grid: i64) -> TiledMask {
        self.planned(&self.plan(spans, grid))
    }

    fn planned(&self, plan: &WindowPlan) -> TiledMask {
        TiledMask::new(
            &context_mask(&self.docs, &self.anchors),
            &self.anchors.valid,
            self.block,
            plan,
        )
    }

    fn dense(&self) -> Tensor {
        block_mask(&self.docs, &self.anchors, self.block)
    }
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
fn context_spans_reach_from_the_first_document_start_to_the_last_anchor() {
    let f = fixture();
    let span = |start, end| Span { start, end };
    assert_eq!(
        f.spans(),
        vec![
            // Row 0: anchors 0..=59 (documents 0 and 1), then 61..=95 (documents 1 and 2).
            span(0, 59),
            span(30, 95),
            // Row 1: one tile of anchors, one of padding.
            span(0, 52),
            Span::EMPTY,
            // Row 2: the whole context.
            span(0, 93),
            Span::EMPTY,
            // Row 3: the lone anchor at a document start sees no context.
            span(0, 63),
            Span::EMPTY,
        ]
    );
    // A document id that comes back later in a row is the same document to the mask.
    let docs = [5i64, 5, 6, 6, 5, 5, 5, 5];
    assert_eq!(context_spans(&[vec![6]], 1, &docs, 8), vec![span(0, 6)]);
    assert_eq!(context_spans(&[vec![3]], 1, &docs, 8), vec![span(2, 3)]);
    assert_eq!(context_spans(&[vec![2]], 1, &docs, 8), vec![Span::EMPTY]);
}

#[test]
fn windows_round_out_to_the_grid_and_stay_inside_the_row() {
    assert_eq!(window_grid(3072), 512);
    assert_eq!(window_grid(96), 96);
    let span = |start, end| Span { start, end };
    assert_eq!(span(3, 5).window(16, 96), (0, 16));
    assert_eq!(span(90, 95).window(16, 96), (80, 16));
    assert_eq!(span(30, 95).window(16, 96), (16, 80));
    assert_eq!(span(0, 93).window(16, 96), (0, 96));
    assert_eq!(Span::EMPTY.window(16, 96), (0, 0));
    assert_eq!(span(7, 9).window(1, 96), (7, 2));
    assert_eq!(span(40, 50).union(span(7, 9)), span(7, 50));
    assert_eq!(Span::EMPTY.union(span(7, 9)), span(7, 9));
}

/// Consecutive tiles are cut into equal runs that share a window (the union of their tiles').
#[test]
fn runs_of_tiles_share_the_union_of_their_windows() {
    let span = |start, end| Span { start, end };
    let tiles = [
        span(0, 100),
        span(0, 200),
        span(1000, 1100),
        span(1000, 1200),
    ];
    assert_eq!(plan_runs(&tiles, 100, 2000, 1), vec![[0, 4, 0, 1200]]);
    assert_eq!(
        plan_runs(&tiles, 100, 2000, 2),
        vec![[0, 2, 0, 200], [2, 2, 1000, 200]]
    );
    // Three runs do not divide four tiles: two.
    assert_eq!(plan_runs(&tiles, 100, 2000, 3).len(), 2);
    assert_eq!(
        plan_runs(&tiles, 100, 2000, 8),
        vec![
            [0, 1, 0, 100],
            [1, 1, 0, 200],
            [2, 1, 1000, 100],
            [3, 1, 1000, 200]
        ]
    );
    // Edges rounded out to the grid; tiles that see no context: an empty window.
    assert_eq!(plan_runs(&tiles[1..2], 128, 2000, 1), vec![[0, 1, 0, 256]]);
    assert_eq!(
        plan_runs(&[Span::EMPTY; 3], 100, 2000, 8),
        vec![[0, 1, 0, 0], [1, 1, 0, 0], [2, 1, 0, 0]]
    );
}

/// The windows hold exactly the context keys the dense mask shows: put back in place, the
/// windowed masks are the context mask, with no key dropped and none let in. Shrinking a window
/// by one key at either end drops a key, and the check sees it.
#[test]
fn windows_hold_exactly_the_visible_context_keys() {
    let f = fixture();
    let spans = f.spans();
    for grid in [1, 16, window_grid(f.s)] {
        let m = f.tiled(&spans, grid);
        assert!(
            m.windowed_context().equal(m.ctx()),
            "grid {grid}: windows differ from the context mask"
        );
        assert!(AttnMask::Tiled(m).dense().equal(&f.dense()));
    }
    // Over the rows, tile 0 spans [0, 93) and tile 1 [30, 95): two runs on a grid of 16.
    let m = f.tiled(&spans, 16);
    let runs: Vec<[i64; 4]> = m
        .runs()
        .iter()
        .map(|r| [r.first, r.count, r.start, r.len])
        .collect();
    assert_eq!(runs, vec![[0, 1, 0, 96], [1, 1, 16, 80]], "one call each");
    // A tile's window is the union over the rows: shrinking the span that reaches furthest
    // (row 0's tile 1 at either end, row 2's tile 0 at its end) drops a key.
    for (i, shrink) in [(1usize, (1, 0)), (1, (0, 1)), (4, (0, 1))] {
        let mut spans = spans.clone();
        spans[i].start += shrink.0;
        spans[i].end -= shrink.1;
        let m = f.tiled(&spans, 1);
        assert!(
            !m.windowed_context().equal(m.ctx()),
            "tile {i} shrunk by {shrink:?} must lose a visible key"
        );
    }
}

/// The per-query masks (about 1 GiB at 32K tokens a row) are built only when the sdpa path asks
/// for them: a mask the block attention kernels take costs its anchors' context mask alone.
#[test]
fn a_tiled_mask_builds_its_per_query_masks_only_when_asked() {
    tch::manual_seed(3);
    let f = fixture();
    let m = f.tiled(&f.spans(), window_grid(f.s));
    assert!(!m.is_built(), "new() must not build the sdpa path's masks");
    let qkv = Qkv::new(&f, (4, 2, 8), Kind::Float, Device::Cpu);
    let got = qkv.run(|q, k, v| tiled_attention(q, k, v, &m));
    assert!(m.is_built(), "the tiled path builds them");
    let want = qkv.run(|q, k, v| masked_attention(q, k, v, &f.dense()));
    assert!(got[0].allclose(&want[0], 1e-5, 1e-5, false));
}

/// Random queries, keys and values through the tiled attention and the dense mask: the same
/// outputs and the same gradients to q, k and v, whatever the window grid. A window one key
/// short changes them far beyond the tolerance.
#[test]
fn tiled_attention_equals_the_dense_mask_in_q_k_v_gradients() {
    tch::manual_seed(11);
    let f = fixture();
    let qkv = Qkv::new(&f, (4, 2, 8), Kind::Float, Device::Cpu);
    let dense = f.dense();
    let want = qkv.run(|q, k, v| masked_attention(q, k, v, &dense));
    // Rows of padding anchors come back as zeros; the others see something.
    let seen = dense.any_dim(-1, false).squeeze_dim(1); // [b, q]
    assert!(!bool::try_from(seen.all()).unwrap() && bool::try_from(seen.any()).unwrap());
    let spans = f.spans();
    for grid in [1, 16, window_grid(f.s)] {
        let m = f.tiled(&spans, grid);
        let got = qkv.run(|q, k, v| tiled_attention(q, k, v, &m));
        for (name, (x, y)) in ["out", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
            let diff = max_diff(x, y);
            assert!(diff < 1e-5, "grid {grid}: {name} differs by {diff}");
        }
    }
    // Row 2's first tile one key short at its end (the furthest of tile 0's spans): its last
    // anchor (93) no longer sees key 92.
    let mut short = spans.clone();
    short[4].end -= 1;
    let m = f.tiled(&short, 1);
    let got = qkv.run(|q, k, v| tiled_attention(q, k, v, &m));
    assert!(max_diff(&want[0], &got[0]) > 1e-2, "a dropped key shows");
    assert!(
        max_diff(&want[2], &got[2]) > 1e-2,
        "a dropped key shows in dk"
    );
}

/// A plan whose windows hold the batch's own (a CUDA graph kept for another batch) gives the
/// same attention and gradients as the batch's own plan; a plan whose window misses a visible
/// key does not cover it.
#[test]
fn a_covering_plan_attends_like_the_batch_own_plan() {
    tch::manual_seed(12);
    let f = fixture();
    let qkv = Qkv::new(&f, (4, 2, 8), Kind::Float, Device::Cpu);
    let own = f.plan(&f.spans(), 16);
    let wider = WindowPlan(
        own.0
            .iter()
            .map(|&[first, count, start, len]| {
                let from = (start - 16).max(0);
                [first, count, from, (start + len + 16).min(f.s) - from]
            })
            .collect(),
    );
    assert!(wider.covers(&own) && !own.covers(&wider) && wider.keys() > own.keys());
    let want = qkv.run(|q, k, v| tiled_attention(q, k, v, &f.planned(&own)));
    let got = qkv.run(|q, k, v| tiled_attention(q, k, v, &f.planned(&wider)));
    for (name, (x, y)) in ["out", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
        let diff = max_diff(x, y);
        assert!(diff < 1e-5, "{name} differs by {diff}");
    }
    let mut short = own.clone();
    short.0[1][3] -= 16;
    assert!(
        !short.covers(&own),
        "a window one grid step short covers nothing longer"
    );
}

/// The windowed tiles against the dense mask on CUDA in bf16 (the kernels the drafter trains
/// with there), forward and q, k, v gradients. Runs where a GPU is; elsewhere it says so.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn tiled_attention_equals_the_dense_mask_on_cuda() {
    let Some(dev) = crate::cuda_or_skip("the tiled attention in bf16 on CUDA") else {
        return;
    };
    tch::manual_seed(5);
    let f = fixture();
    let anchors = f.anchors.to_device(dev);
    let docs = f.docs.to_device(dev);
    let m = tiled_block_mask(&docs, &anchors, f.block, &f.per_row, &f.host_docs);
    let dense = block_mask(&docs, &anchors, f.block);
    let qkv = Qkv::new(&f, (4, 2, 64), Kind::BFloat16, dev);
    let want = qkv.run(|q, k, v| masked_attention(q, k, v, &dense));
    let got = qkv.run(|q, k, v| tiled_attention(q, k, v, &m));
    for (name, (x, y)) in ["out", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
        // The fixture has padding anchors: rows that see no key must not make NaN either way.
        for (path, t) in [("dense", x), ("tiled", y)] {
            assert!(
                bool::try_from(t.isfinite().all()).unwrap(),
                "{name} not finite ({path})"
            );
        }
        let scale = f64::try_from(x.abs().max()).unwrap().max(1e-3);
        let diff = max_diff(x, y);
        eprintln!("{name}: max |diff| {diff:.4} of max |x| {scale:.3}");
        assert!(
            diff <= 0.02 * scale,
            "{name} differs by {diff} (scale {scale})"
        );
    }
}

/// The whole drafter (several layers) on the tiled mask and on the dense one: same outputs, same
/// weight gradients.
#[test]
fn tiled_attention_equals_the_dense_mask_forward_and_backward() {
    tch::manual_seed(7);
    let f = fixture();
    let p = Preset::by_name("tiny").unwrap();
    let mut spec = p.drafter_spec(&p.target);
    spec.block_size = f.block;
    let c = spec.layers.clone();
    let (b, a) = (4i64, f.anchors.pos.size()[1]);
    let tiled = tiled_block_mask(&f.docs, &f.anchors, f.block, &f.per_row, &f.host_docs);
    assert_eq!(tiled.tile, 32 * f.block);
    assert_eq!(host_rows(&f.anchors), f.per_row);
    let dense = f.dense();

    let vs = VarStore::new(Device::Cpu);
    let drafter = Drafter::new(&vs.root(), &spec);
    let n_feat = spec.target_layer_ids.len() as i64;
    let hidden = Tensor::randn([b, f.s, n_feat * c.hidden_size], (Kind::Float, Device::Cpu));
    let emb = Tensor::randn([b, a * f.block, c.hidden_size], (Kind::Float, Device::Cpu));
    let bpos = block_positions(&f.pos, &f.anchors, f.block);
    let run = |mask: &AttnMask| {
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let out = drafter.forward_masked(&hidden, &f.pos, &emb, &bpos, mask);
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
    use dflash_top::engine::model::varlen::Varlen;
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
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn flash_target_equals_the_dense_document_mask_on_cuda() {
    use dflash_top::engine::model::qwen3::Qwen3Target;
    use dflash_top::engine::model::varlen::Varlen;
    let Some(dev) = crate::cuda_shim_or_skip("the flash path") else {
        return;
    };
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

/// Rows for the block attention kernels (blocks of 16, heads of 128): 2 rows of 200 context
/// tokens (not a whole number of the kernels' 64-key tiles), 24 anchors a row.
/// - row 0: documents 0 (50 tokens), 1 (60), 0 again (40) and 2 (50): a block in the second
///   document 0 has the first one's keys inside its span and must not see them; anchors at
///   document starts (blocks that see only their own keys);
/// - row 1: one document of 130 and 70 of padding; 9 anchors, the rest padding blocks.
struct KernelRows {
    docs: Tensor,
    per_row: Vec<Vec<i64>>,
    anchors: Anchors,
    s: i64,
}

fn kernel_rows() -> KernelRows {
    let (s, width) = (200i64, 24usize);
    let host_docs: Vec<i64> = [(0, 50), (1, 60), (0, 40), (2, 50), (0, 130), (9, 70)]
        .iter()
        .flat_map(|&(d, n)| std::iter::repeat_n(d, n))
        .collect();
    let row0: Vec<i64> = [
        0, 3, 20, 49, 50, 51, 77, 109, 110, 111, 130, 149, 150, 151, 160,
    ]
    .into_iter()
    .chain((170..200).step_by(4))
    .collect();
    let row1: Vec<i64> = (0..130).step_by(15).collect();
    assert_eq!((row0.len(), row1.len()), (23, 9));
    let per_row = vec![row0, row1];
    KernelRows {
        docs: Tensor::from_slice(&host_docs).view([2, s]),
        anchors: anchors_tensor(&per_row, width, Device::Cpu),
        per_row,
        s,
    }
}

/// Each block's span says exactly which context keys the mask shows it: the keys in
/// `[start, end)` of the anchor's document, none for a padding block (computed on the CPU here;
/// the kernels take it on CUDA).
#[test]
fn block_spans_hold_exactly_the_keys_the_mask_shows() {
    let r = kernel_rows();
    let ctx = context_mask(&r.docs, &r.anchors);
    let spans = block_spans(&ctx, &r.docs, &r.anchors);
    let (b, a) = (2usize, r.anchors.pos.size()[1] as usize);
    let spans = Vec::<i32>::try_from(spans.flatten(0, -1)).unwrap();
    let mask = Vec::<bool>::try_from(ctx.flatten(0, -1)).unwrap();
    let docs = Vec::<i64>::try_from(r.docs.flatten(0, -1)).unwrap();
    let s = r.s as usize;
    let mut seen_split = false;
    for row in 0..b {
        for j in 0..a {
            let [start, end, doc, real] = spans[(row * a + j) * 4..][..4] else {
                unreachable!()
            };
            assert_eq!(real == 1, j < r.per_row[row].len(), "row {row} block {j}");
            for key in 0..s {
                let by_span = (start as usize..end as usize).contains(&key)
                    && docs[row * s + key] == doc as i64;
                assert_eq!(
                    by_span,
                    mask[(row * a + j) * s + key],
                    "row {row} block {j} key {key}"
                );
                seen_split |= (start as usize..end as usize).contains(&key) && !by_span;
            }
        }
    }
    assert!(seen_split, "a span holds another document's keys somewhere");
}

/// The block attention kernels against the dense mask on CUDA in bf16 (libtorch's sdpa):
/// output and q, k, v gradients, at the 8B drafter's heads (32 query heads over 8 KV heads), the
/// 0.6B's (16 over 8), the 14B's (40 over 8: a group of 5 in chunks of 3 and 2, the last with a
/// spare warp), the 32B's (64 over 8: two chunks of 4), a group of 3 (one chunk of 3 warps), of 9
/// (three chunks of 3), of 10 (4 + 4 + 2: two spare warps) and of 7 over a single KV head (4 + 3),
/// with padding blocks, blocks that see only their own keys, and a document that comes back in a
/// row.
#[test]
#[ignore = "needs a GPU: `make gpu-tests`, then docs/gpu.md runs them on the GPU host"]
fn the_block_attention_kernels_equal_the_dense_mask_on_cuda() {
    use dflash_top::engine::gpu::cuda::{block_attention, block_attention_state};
    let Some(dev) = crate::cuda_shim_or_skip("the block attention kernels") else {
        return;
    };
    tch::manual_seed(21);
    let r = kernel_rows();
    let anchors = r.anchors.to_device(dev);
    let docs = r.docs.to_device(dev);
    let block = 16;
    let dense = block_mask(&docs, &anchors, block);
    let spans = block_spans(&context_mask(&docs, &anchors), &docs, &anchors);
    let docs32 = docs.to_kind(Kind::Int);
    for (hq, hkv) in [
        (32, 8),
        (16, 8),
        (40, 8),
        (64, 8),
        (6, 2),
        (18, 2),
        (20, 2),
        (7, 1),
    ] {
        let (b, lq) = (2, anchors.pos.size()[1] * block);
        // Token-major, as the drafter's layers make them: [b, l, heads, 128].
        let rand = |h: i64, l: i64| {
            Tensor::randn([b, l, h, 128], (Kind::Float, Device::Cpu))
                .to_device(dev)
                .to_kind(Kind::BFloat16)
                .set_requires_grad(true)
        };
        let (q, k, v) = (rand(hq, lq), rand(hkv, r.s + lq), rand(hkv, r.s + lq));
        let upstream = rand(hq, lq).detach();
        let run = |attend: &dyn Fn() -> Tensor| {
            for x in [&q, &k, &v] {
                let mut g = x.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
            let out = attend();
            (&out * &upstream).sum(Kind::Float).backward();
            [out.detach(), q.grad(), k.grad(), v.grad()].map(|x| x.to_kind(Kind::Float).copy())
        };
        let heads = |t: &Tensor| t.transpose(1, 2);
        let want = run(&|| {
            heads(&masked_attention(
                &heads(&q),
                &heads(&k),
                &heads(&v),
                &dense,
            ))
        });
        let got = run(&|| {
            block_attention(&q, &k, &v, &spans, &docs32)
                .unwrap_or_else(|| panic!("the kernels did not run: {}", block_attention_state()))
        });
        for (name, (x, y)) in ["out", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
            assert!(
                bool::try_from(y.isfinite().all()).unwrap(),
                "{name} not finite ({hq} heads)"
            );
            let scale = f64::try_from(x.abs().max()).unwrap().max(1e-3);
            let diff = max_diff(x, y);
            eprintln!("{hq}/{hkv} heads {name}: max |diff| {diff:.4} of max |x| {scale:.3}");
            assert!(
                diff <= 0.02 * scale,
                "{name} differs by {diff} (scale {scale}, {hq} heads)"
            );
        }
        // Padding blocks give zeros.
        let padded = got[0].narrow(0, 1, 1).narrow(1, 9 * block, lq - 9 * block);
        assert_eq!(f64::try_from(padded.abs().max()).unwrap(), 0.0);
    }
}
