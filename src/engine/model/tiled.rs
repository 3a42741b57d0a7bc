//! The drafter's attention without most of the work its mask hides, through libtorch's sdpa: the
//! path where the block attention kernels (src/engine/gpu/cuda/block_attention.rs, which compute only
//! the visible pairs) cannot run, and under `--disable block-attention`. A block of 16 queries sees the
//! context keys before its anchor (in its document) and the 16 keys of its own block, never
//! another block: with 512 blocks, 73% of the dense key range is other blocks' keys. Here the
//! blocks are taken in tiles of 32 anchors (`max_tile_anchors`); each tile attends to its own tile's block
//! keys and to a window of the context. Anchors are sorted, so consecutive tiles have close
//! windows: the tiles are cut into `window_groups(rows)` equal runs (2 for one row, 4 for more,
//! unless `[fast_paths]` says)
//! of consecutive tiles, each run with one window for all its tiles and rows (from the earliest
//! document start of its anchors to its last anchor, rounded out to a coarse grid: few shapes). A run is one batched
//! scaled-dot-product call over `[context window, own block keys]`, its keys a slice of the
//! context (no gather, so nothing to scatter back in backward). The visible set is exactly the
//! dense mask's, so the result is the same up to float rounding.

use tch::{Kind, Tensor};

/// Anchors per tile at most, as this process runs: 32 (512 queries at block 16) unless
/// `tile_anchors` under the TOML's `[fast_paths]` sets another, for side-by-side measurements.
fn max_tile_anchors() -> i64 {
    crate::engine::gpu::fast_paths::tile_anchors()
}

/// An attention's mask: dense, the drafter's tiles, or the target's documents for a causal
/// flash kernel (no mask tensor at all).
pub enum AttnMask {
    /// [b, 1, q, k] bool, true = attend.
    Dense(Tensor),
    Tiled(TiledMask),
    /// Causal within each document (and within `window` keys on sliding layers).
    Documents {
        docs: super::varlen::Varlen,
        window: Option<i64>,
    },
}

/// The block mask in tiles: the context part per query, each tile's block-diagonal part, and
/// the runs of tiles that share a context window. The per-query tensors (`ctx`, `blocks` and the
/// runs' masks, about 1 GiB at 32K tokens a row) are built the first time a path asks for them:
/// where the block attention kernels run, they never are.
pub struct TiledMask {
    /// [b, a, s] bool: anchor's block sees context key.
    anchors_ctx: Tensor,
    /// [b, a] bool: the anchor is real.
    valid: Tensor,
    block: i64,
    plan: WindowPlan,
    /// Queries per tile.
    pub tile: i64,
    built: std::cell::OnceCell<Built>,
    /// Each block's span [b, a, 4] and the context's documents [b, s], both int32, where the
    /// block attention kernels may run (`blocks::block_spans`; on CUDA only).
    block_spans: Option<(Tensor, Tensor)>,
}

/// What the sdpa paths read, built from the anchors' context mask when first asked for.
struct Built {
    /// [b, q, s] bool: query sees context key.
    ctx: Tensor,
    /// [b, tiles, t, t] bool: query sees block key of the same tile (its own block).
    blocks: Tensor,
    /// Consecutive tiles with one context window each, in tile order, covering every tile.
    runs: Vec<TileRun>,
}

/// Consecutive tiles (the same ones in every row) that attend to one context window: one call.
pub struct TileRun {
    /// First tile and number of tiles.
    pub first: i64,
    pub count: i64,
    /// Context keys `[start, start + len)` of every row.
    pub start: i64,
    pub len: i64,
    /// [b * count, 1, t, len + t] bool: the window's part of the context mask, then the block
    /// part; a row that sees no key is given every key (`layers::prepare_mask`).
    mask: Tensor,
    /// [b * count, 1, t, 1] bool: rows that see no key (their output is cleared).
    blocked: Tensor,
}

/// Context keys `[start, end)` of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: i64,
    pub end: i64,
}

impl Span {
    pub const EMPTY: Span = Span { start: 0, end: 0 };

    pub fn len(&self) -> i64 {
        (self.end - self.start).max(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window that holds this span: its start rounded down and its end rounded up to
    /// `grid` (at most `s`). Returns (start, length); (0, 0) for an empty span.
    pub fn window(&self, grid: i64, s: i64) -> (i64, i64) {
        if self.is_empty() {
            return (0, 0);
        }
        let grid = grid.max(1);
        let start = self.start / grid * grid;
        (start, round_up(self.end, grid).min(s) - start)
    }

    /// The smallest span that holds both (an empty one holds nothing).
    pub fn union(self, other: Span) -> Span {
        match (self.is_empty(), other.is_empty()) {
            (true, _) => other,
            (_, true) => self,
            _ => Span {
                start: self.start.min(other.start),
                end: self.end.max(other.end),
            },
        }
    }
}

impl AttnMask {
    /// The mask as one dense [b, 1, q, s + q] tensor (sliding layers and checks use it).
    pub fn dense(&self) -> Tensor {
        match self {
            AttnMask::Dense(m) => m.shallow_clone(),
            AttnMask::Tiled(t) => t.dense(),
            AttnMask::Documents { .. } => {
                unreachable!("the documents' mask is only built where no dense one is asked for")
            }
        }
    }
}

/// The anchor tensor's width for a batch whose fullest row has `count` anchors: rounded up to
/// a whole number of tiles once there is more than one tile's worth (at least 1).
pub fn padded_width(count: usize) -> usize {
    let tile = max_tile_anchors() as usize;
    if count <= tile {
        count.max(1)
    } else {
        count.div_ceil(tile) * tile
    }
}

/// Anchors per tile for `anchors` anchors: the largest divisor of it up to the tile's size
/// (`max_tile_anchors`).
pub fn tile_anchors(anchors: i64) -> i64 {
    (1..=max_tile_anchors().min(anchors.max(1)))
        .rev()
        .find(|t| anchors % t == 0)
        .unwrap_or(1)
}

/// The window grid for rows of `s` keys: a sixth of the row rounded up to 128 keys (512 at 3072),
/// at most `s`: seven window lengths at most.
pub fn window_grid(s: i64) -> i64 {
    let s = s.max(1);
    round_up((s + 5) / 6, 128).min(s)
}

/// Runs of tiles a layer for a batch of `rows` rows (`window_groups` in the TOML's
/// `[fast_paths]`, 1 to 64, for side-by-side measurements); 1 is one call a layer over the union
/// of the windows.
pub fn window_groups(rows: usize) -> i64 {
    crate::engine::gpu::fast_paths::window_groups_for(rows)
}

/// `x` (non-negative) rounded up to a multiple of `m` (positive).
fn round_up(x: i64, m: i64) -> i64 {
    (x + m - 1) / m * m
}

/// Each tile's context span, row-major (row, then tile): from the first key of the document of
/// its earliest anchor to its last anchor (exclusive), the keys any of its blocks may see; empty
/// for a tile of padding or of anchors at their documents' first token. From the host copies of
/// the anchors (`per_row`, `width` a row as `anchors_tensor` pads them) and of the document ids
/// (`[rows * seq]`): no read-back from the device.
pub fn context_spans(per_row: &[Vec<i64>], width: usize, doc_ids: &[i64], seq: usize) -> Vec<Span> {
    let per_tile = tile_anchors(width as i64) as usize;
    let mut spans = Vec::with_capacity(per_row.len() * width / per_tile);
    for (r, anchors) in per_row.iter().enumerate() {
        let docs = &doc_ids[r * seq..(r + 1) * seq];
        // First key of each position's document (a document id may come back later in a row).
        let mut first_of_id = std::collections::HashMap::new();
        let first: Vec<i64> = (0..seq)
            .map(|i| *first_of_id.entry(docs[i]).or_insert(i as i64))
            .collect();
        let anchors = &anchors[..anchors.len().min(width)];
        for tile in 0..width / per_tile {
            let lo = (tile * per_tile).min(anchors.len());
            let hi = ((tile + 1) * per_tile).min(anchors.len());
            let tile_anchors = &anchors[lo..hi];
            let start = tile_anchors.iter().map(|&p| first[p as usize]).min();
            let end = tile_anchors.iter().copied().max();
            spans.push(match (start, end) {
                (Some(start), Some(end)) if end > start => Span { start, end },
                _ => Span::EMPTY,
            });
        }
    }
    spans
}

/// Cuts consecutive tiles, each with its context span (over all rows), into `runs` runs of
/// equal length (fewer where the tiles do not divide), each run with the union of its tiles'
/// windows. Equal runs and a coarse grid keep the shapes few: the attention kernels build a plan
/// per shape, and a new one each step costs more than the keys it saves. Returns (first, count,
/// start, len) per run.
pub fn plan_runs(spans: &[Span], grid: i64, s: i64, runs: usize) -> Vec<[i64; 4]> {
    let n = spans.len();
    let runs = (1..=runs.clamp(1, n.max(1)))
        .rev()
        .find(|r| n.is_multiple_of(*r))
        .unwrap_or(1);
    let per = (n / runs).max(1);
    (0..n)
        .step_by(per)
        .map(|i| {
            let j = (i + per).min(n);
            let span = spans[i..j].iter().fold(Span::EMPTY, |u, x| u.union(*x));
            let (start, len) = span.window(grid, s);
            [i as i64, (j - i) as i64, start, len]
        })
        .collect()
}

/// The runs of tiles a step's attention makes: each run's first tile, its number of tiles, and
/// its context window's start and length (the same in every row). Planned on the host; the
/// shapes and offsets of the step's attention calls follow from it alone, so a CUDA graph of a
/// step serves every batch of its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowPlan(pub Vec<[i64; 4]>);

impl WindowPlan {
    /// From each tile's context span (row-major over `rows` rows, as `context_spans` gives
    /// them), windows rounded out to `grid` keys of rows of `s` keys.
    pub fn from_spans(spans: &[Span], rows: usize, grid: i64, s: i64) -> WindowPlan {
        let tiles = spans.len() / rows.max(1);
        // A tile's span over all rows (the runs are the same tiles in every row).
        let per_tile: Vec<Span> = (0..tiles)
            .map(|j| {
                (0..rows)
                    .map(|r| spans[r * tiles + j])
                    .fold(Span::EMPTY, Span::union)
            })
            .collect();
        WindowPlan(plan_runs(&per_tile, grid, s, window_groups(rows) as usize))
    }

    /// Tiles the runs cover.
    pub fn tiles(&self) -> i64 {
        self.0.iter().map(|r| r[1]).sum()
    }

    /// Context keys the runs attend to, counted once per tile.
    pub fn keys(&self) -> i64 {
        self.0.iter().map(|[_, count, _, len]| count * len).sum()
    }

    /// Whether this plan's runs are `other`'s tiles, each run's window holding the other's: a
    /// step planned as `other` may run as this one (more keys, the same visible set).
    pub fn covers(&self, other: &WindowPlan) -> bool {
        self.0.len() == other.0.len()
            && self.0.iter().zip(&other.0).all(|(a, b)| {
                let holds = b[3] == 0 || (a[2] <= b[2] && a[2] + a[3] >= b[2] + b[3]);
                a[..2] == b[..2] && holds
            })
    }
}

impl TiledMask {
    /// From the per-anchor context visibility `ctx` [b, a, s], the anchors' validity [b, a], the
    /// block size, and the runs' windows (`plan`: every context key a tile's blocks see must lie
    /// in its run's window, as `WindowPlan::from_spans` plans them).
    pub fn new(ctx: &Tensor, valid: &Tensor, block: i64, plan: &WindowPlan) -> TiledMask {
        let a = ctx.size()[1];
        let tiles = a / tile_anchors(a);
        assert_eq!(
            plan.tiles(),
            tiles,
            "the plan's runs cover the {tiles} tiles"
        );
        TiledMask {
            anchors_ctx: ctx.shallow_clone(),
            valid: valid.shallow_clone(),
            block,
            plan: plan.clone(),
            tile: tile_anchors(a) * block,
            built: std::cell::OnceCell::new(),
            block_spans: None,
        }
    }

    /// [b, q, s] bool: query sees context key.
    pub fn ctx(&self) -> &Tensor {
        &self.built().ctx
    }

    /// Consecutive tiles with one context window each, in tile order, covering every tile.
    pub fn runs(&self) -> &[TileRun] {
        &self.built().runs
    }

    /// Whether a path asked for the per-query masks (the block attention kernels never do).
    pub fn is_built(&self) -> bool {
        self.built.get().is_some()
    }

    fn built(&self) -> &Built {
        self.built.get_or_init(|| self.build())
    }

    fn build(&self) -> Built {
        let (ctx, valid, block) = (&self.anchors_ctx, &self.valid, self.block);
        let (b, a, s) = (ctx.size()[0], ctx.size()[1], ctx.size()[2]);
        let per_tile = tile_anchors(a);
        let tiles = a / per_tile;
        let tile = self.tile;
        let dev = ctx.device();
        let ctx = ctx
            .unsqueeze(2)
            .expand([b, a, block, s], false)
            .reshape([b, a * block, s]);
        let block_of =
            Tensor::arange(per_tile, (Kind::Int64, dev)).repeat_interleave_self_int(block, 0, None);
        let own = block_of.unsqueeze(1).eq_tensor(&block_of.unsqueeze(0)); // [t, t]
        let rows = valid
            .repeat_interleave_self_int(block, 1, None)
            .view([b, tiles, tile, 1]);
        let blocks = own.view([1, 1, tile, tile]).logical_and(&rows);

        let ctx_tiles = ctx.view([b, tiles, tile, s]);
        let runs = self
            .plan
            .0
            .iter()
            .map(|&[first, count, start, len]| {
                let seen = ctx_tiles.narrow(1, first, count).narrow(3, start, len);
                let mask = Tensor::cat(&[seen, blocks.narrow(1, first, count)], -1).reshape([
                    b * count,
                    1,
                    tile,
                    len + tile,
                ]);
                let (mask, blocked) = super::layers::prepare_mask(&mask);
                TileRun {
                    first,
                    count,
                    start,
                    len,
                    mask,
                    blocked,
                }
            })
            .collect();
        Built { ctx, blocks, runs }
    }

    /// This mask with each block's span and the context's documents (`blocks::block_spans`), so
    /// that the block attention kernels may run in its place.
    pub fn with_block_spans(mut self, spans: Tensor, docs: Tensor) -> TiledMask {
        self.block_spans = Some((spans, docs));
        self
    }

    /// The blocks' spans and the context's documents, where given (`with_block_spans`).
    pub fn block_spans(&self) -> Option<(&Tensor, &Tensor)> {
        self.block_spans.as_ref().map(|(s, d)| (s, d))
    }

    fn dense(&self) -> Tensor {
        let built = self.built();
        let (b, q) = (built.ctx.size()[0], built.ctx.size()[1]);
        let tiles = q / self.tile;
        // Block-diagonal over tiles: [b, tiles, t, tiles, t] with the tile's part on the diagonal.
        let eye =
            Tensor::eye(tiles, (Kind::Bool, built.ctx.device())).view([1, tiles, 1, tiles, 1]);
        let blocks = built
            .blocks
            .view([b, tiles, self.tile, 1, self.tile])
            .logical_and(&eye)
            .reshape([b, q, q]);
        Tensor::cat(&[&built.ctx, &blocks], -1).unsqueeze(1)
    }

    /// The context mask [b, q, s] as the runs' windows hold it: each run's part put back at its
    /// keys, false elsewhere. Equal to `ctx` when no window drops a key its blocks see.
    pub fn windowed_context(&self) -> Tensor {
        let ctx = self.ctx();
        let (b, q, s) = (ctx.size()[0], ctx.size()[1], ctx.size()[2]);
        let t = self.tile;
        let out = Tensor::zeros([b, q / t, t, s], (Kind::Bool, ctx.device()));
        for r in self.runs() {
            let seen = r
                .mask
                .logical_and(&r.blocked.logical_not())
                .narrow(3, 0, r.len)
                .reshape([b, r.count, t, r.len]);
            out.narrow(1, r.first, r.count)
                .narrow(3, r.start, r.len)
                .copy_(&seen);
        }
        out.view([b, q, s])
    }
}

/// Attention of block queries over `[context, blocks]` keys: each run of tiles over its context
/// window and each tile's own block keys, one batched call per run; rows the mask blocks entirely
/// come back as zeros.
// q [b, hq, q, d], k/v [b, hkv, s + q, d] -> [b, hq, q, d]
pub fn tiled_attention(q: &Tensor, k: &Tensor, v: &Tensor, m: &TiledMask) -> Tensor {
    let (b, hq, lq, d) = (q.size()[0], q.size()[1], q.size()[2], q.size()[3]);
    let hkv = k.size()[1];
    let s = k.size()[2] - lq;
    let t = m.tile;
    let tiles = lq / t;
    // Tiles first, count of them: [b, h, tiles*t, d] -> [b, count, h, t, d]
    let run_tiles = |x: &Tensor, h: i64, r: &TileRun| {
        x.view([b, h, tiles, t, d])
            .narrow(2, r.first, r.count)
            .permute([0, 2, 1, 3, 4])
    };
    let outs: Vec<Tensor> = m
        .runs()
        .iter()
        .map(|r| {
            // [b * count, hkv, len + t, d]: the window (one slice, shared by the run's tiles)
            // then each tile's own block keys.
            let keys = |x: &Tensor| {
                let window = x
                    .narrow(2, r.start, r.len)
                    .unsqueeze(1)
                    .expand([b, r.count, hkv, r.len, d], false);
                let own = run_tiles(&x.narrow(2, s, lq), hkv, r);
                Tensor::cat(&[window, own], 3).reshape([b * r.count, hkv, r.len + t, d])
            };
            let queries = run_tiles(q, hq, r).reshape([b * r.count, hq, t, d]);
            super::layers::attend(&queries, &keys(k), &keys(v), &r.mask, &r.blocked)
                .view([b, r.count, hq, t, d])
        })
        .collect();
    Tensor::cat(&outs, 1)
        .permute([0, 2, 1, 3, 4])
        .reshape([b, hq, lq, d])
}
