//! The drafter's attention without the work its mask hides. A block of 16 queries sees the
//! context keys before its anchor (in its document) and the 16 keys of its own block, never
//! another block: with 512 blocks, 73% of the dense key range is other blocks' keys. Here the
//! blocks are taken in tiles of `TILE_ANCHORS` anchors; each tile attends to its own tile's block
//! keys and to a window of the context: from the first key of its earliest anchor's document to
//! its last anchor, the only context keys its blocks can see (about half the context on average,
//! less in packed rows). The windows come from the host copies of the anchors and document ids;
//! their lengths are rounded up to a grid of `s / WINDOW_GROUPS` keys so that tiles of one length
//! share one batched scaled-dot-product call (a handful a layer). The visible set is exactly the
//! dense mask's, so the result is the same up to float rounding.

use std::collections::BTreeMap;
use tch::{Kind, Tensor};

/// Anchors per tile (at most): 512 queries a tile at block 16.
pub const TILE_ANCHORS: i64 = 32;

/// Distinct context window lengths (at most, besides the empty one): attention calls a layer.
pub const WINDOW_GROUPS: i64 = 8;

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

/// The block mask in tiles: the context part per query, and each tile's block-diagonal part;
/// the tiles grouped by the length of their context windows.
pub struct TiledMask {
    /// [b, q, s] bool: query sees context key.
    pub ctx: Tensor,
    /// [b, tiles, t, t] bool: query sees block key of the same tile (its own block).
    pub blocks: Tensor,
    /// Queries per tile.
    pub tile: i64,
    /// Tiles of one window length each, in the order of `order`.
    pub groups: Vec<WindowGroup>,
    /// [b * tiles] i64: the tiles (row-major) in group order.
    order: Tensor,
    /// [b * tiles] i64: where each tile (row-major) stands in group order.
    unorder: Tensor,
}

/// Tiles whose context windows have one length: one attention call.
pub struct WindowGroup {
    /// Context keys per tile.
    pub len: i64,
    /// Tiles in the group.
    pub tiles: i64,
    /// [tiles, len] i64: each tile's window, as key positions in its row.
    keys: Tensor,
    /// [tiles * len] i64: the same keys as indices into the row-major `[b * s]` context.
    flat_keys: Tensor,
    /// [tiles, 1, t, len + t] bool: the window's part of the context mask, then the block part.
    mask: Tensor,
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

    /// The window that holds this span: its length rounded up to `grid` (at most `s`), moved
    /// back where it would pass the row's end. Returns (start, length).
    pub fn window(&self, grid: i64, s: i64) -> (i64, i64) {
        let grid = grid.max(1);
        let len = round_up(self.len(), grid).min(s);
        (self.start.min(s - len).max(0), len)
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
    let tile = TILE_ANCHORS as usize;
    if count <= tile {
        count.max(1)
    } else {
        count.div_ceil(tile) * tile
    }
}

/// Anchors per tile for `anchors` anchors: the largest divisor of it up to `TILE_ANCHORS`.
pub fn tile_anchors(anchors: i64) -> i64 {
    (1..=TILE_ANCHORS.min(anchors.max(1)))
        .rev()
        .find(|t| anchors % t == 0)
        .unwrap_or(1)
}

/// Window lengths are multiples of this for rows of `s` keys: `s / WINDOW_GROUPS` rounded up to
/// 16 keys (384 at 3072), at most `s`. `DFLASH_TOP_WINDOW_GROUPS=N` (1 to 64) sets the count for
/// side-by-side measurements; 1 is one call a layer over the whole context.
pub fn window_grid(s: i64) -> i64 {
    static GROUPS: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let groups = *GROUPS.get_or_init(|| {
        std::env::var("DFLASH_TOP_WINDOW_GROUPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=64).contains(n))
            .unwrap_or(WINDOW_GROUPS)
    });
    let s = s.max(1);
    round_up((s + groups - 1) / groups, 16).min(s)
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

impl TiledMask {
    /// From the per-anchor context visibility `ctx` [b, a, s], the anchors' validity [b, a], the
    /// block size, and each tile's context span (row-major, as `context_spans` gives them; every
    /// context key a tile's blocks see must lie in its span), windows rounded up to `grid` keys.
    pub fn new(ctx: &Tensor, valid: &Tensor, block: i64, spans: &[Span], grid: i64) -> TiledMask {
        let (b, a, s) = (ctx.size()[0], ctx.size()[1], ctx.size()[2]);
        let per_tile = tile_anchors(a);
        let tiles = a / per_tile;
        let tile = per_tile * block;
        let dev = ctx.device();
        assert_eq!(
            spans.len() as i64,
            b * tiles,
            "one context span per tile ({b} rows of {tiles} tiles)"
        );
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

        // Tiles by window length; order, inverse order and window starts go over in one copy.
        let mut by_len: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
        for (n, span) in spans.iter().enumerate() {
            let (start, len) = span.window(grid, s);
            by_len.entry(len).or_default().push((n as i64, start));
        }
        let n = (b * tiles) as usize;
        let mut host = vec![0i64; 3 * n];
        for (at, &(tile_n, start)) in by_len.values().flatten().enumerate() {
            host[at] = tile_n;
            host[n + tile_n as usize] = at as i64;
            host[2 * n + at] = start;
        }
        let host = super::cuda::upload(&Tensor::from_slice(&host), dev);
        let (order, unorder, starts) = (
            host.narrow(0, 0, n as i64),
            host.narrow(0, n as i64, n as i64),
            host.narrow(0, 2 * n as i64, n as i64),
        );
        let ctx_tiles = ctx.view([b * tiles, tile, s]);
        let block_tiles = blocks.view([b * tiles, tile, tile]);
        let mut groups = Vec::with_capacity(by_len.len());
        let mut at = 0;
        for (&len, members) in &by_len {
            let count = members.len() as i64;
            let which = order.narrow(0, at, count);
            let keys = starts.narrow(0, at, count).unsqueeze(1)
                + Tensor::arange(len, (Kind::Int64, dev)).unsqueeze(0); // [count, len]
            let row_base = which.floor_divide_scalar(tiles) * s;
            let flat_keys = (&keys + row_base.unsqueeze(1)).reshape([-1]);
            let seen = ctx_tiles.index_select(0, &which).gather(
                2,
                &keys.unsqueeze(1).expand([count, tile, len], false),
                false,
            );
            let mask = Tensor::cat(&[seen, block_tiles.index_select(0, &which)], -1).unsqueeze(1);
            groups.push(WindowGroup {
                len,
                tiles: count,
                keys,
                flat_keys,
                mask,
            });
            at += count;
        }
        TiledMask {
            ctx,
            blocks,
            tile,
            groups,
            order,
            unorder,
        }
    }

    fn dense(&self) -> Tensor {
        let (b, q) = (self.ctx.size()[0], self.ctx.size()[1]);
        let tiles = q / self.tile;
        // Block-diagonal over tiles: [b, tiles, t, tiles, t] with the tile's part on the diagonal.
        let eye = Tensor::eye(tiles, (Kind::Bool, self.ctx.device())).view([1, tiles, 1, tiles, 1]);
        let blocks = self
            .blocks
            .view([b, tiles, self.tile, 1, self.tile])
            .logical_and(&eye)
            .reshape([b, q, q]);
        Tensor::cat(&[&self.ctx, &blocks], -1).unsqueeze(1)
    }

    /// The context mask [b, q, s] as the windows hold it: each group's part put back at its
    /// keys, false elsewhere. Equal to `ctx` when no window drops a key its blocks see.
    pub fn windowed_context(&self) -> Tensor {
        let (b, q, s) = (self.ctx.size()[0], self.ctx.size()[1], self.ctx.size()[2]);
        let t = self.tile;
        let parts: Vec<Tensor> = self
            .groups
            .iter()
            .map(|g| {
                let seen = g.mask.squeeze_dim(1).narrow(2, 0, g.len);
                Tensor::zeros([g.tiles, t, s], (Kind::Bool, self.ctx.device())).scatter(
                    2,
                    &g.keys.unsqueeze(1).expand([g.tiles, t, g.len], false),
                    &seen,
                )
            })
            .collect();
        Tensor::cat(&parts, 0)
            .index_select(0, &self.unorder)
            .view([b, q, s])
    }
}

/// Attention of block queries over `[context, blocks]` keys: each tile over its context window
/// and its own block keys, one batched call per window length; rows the mask blocks entirely
/// come back as zeros.
// q [b, hq, q, d], k/v [b, hkv, s + q, d] -> [b, hq, q, d]
pub fn tiled_attention(q: &Tensor, k: &Tensor, v: &Tensor, m: &TiledMask) -> Tensor {
    let (b, hq, lq, d) = (q.size()[0], q.size()[1], q.size()[2], q.size()[3]);
    let hkv = k.size()[1];
    let s = k.size()[2] - lq;
    let t = m.tile;
    let tiles = lq / t;
    // [b, h, tiles*t, d] -> [b*tiles, h, t, d] in group order
    let by_tile = |x: &Tensor, h: i64| {
        x.view([b, h, tiles, t, d])
            .permute([0, 2, 1, 3, 4])
            .reshape([b * tiles, h, t, d])
            .index_select(0, &m.order)
    };
    // [b, hkv, s, d] -> [b*s, hkv*d]: a window is rows of it, taken as an embedding lookup,
    // whose backward sums the windows' overlaps in f32 (index_select's adds in bf16 on CUDA)
    let context = |x: &Tensor| x.narrow(2, 0, s).transpose(1, 2).reshape([b * s, hkv * d]);
    let (q_tiles, k_own, v_own) = (
        by_tile(q, hq),
        by_tile(&k.narrow(2, s, lq), hkv),
        by_tile(&v.narrow(2, s, lq), hkv),
    );
    let (k_ctx, v_ctx) = (context(k), context(v));
    let mut outs = Vec::with_capacity(m.groups.len());
    let mut at = 0;
    for g in &m.groups {
        // [count, hkv, len + t, d]
        let keys = |ctx: &Tensor, own: &Tensor| {
            let window = Tensor::embedding(ctx, &g.flat_keys, -1, false, false)
                .view([g.tiles, g.len, hkv, d])
                .transpose(1, 2);
            Tensor::cat(&[window, own.narrow(0, at, g.tiles)], 2)
        };
        outs.push(super::layers::masked_attention(
            &q_tiles.narrow(0, at, g.tiles),
            &keys(&k_ctx, &k_own),
            &keys(&v_ctx, &v_own),
            &g.mask,
        ));
        at += g.tiles;
    }
    Tensor::cat(&outs, 0)
        .index_select(0, &m.unorder)
        .view([b, tiles, hq, t, d])
        .permute([0, 2, 1, 3, 4])
        .reshape([b, hq, lq, d])
}
