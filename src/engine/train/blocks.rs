//! Training blocks: anchor sampling, the block attention mask, block inputs, positions and
//! labels, by DFlash's training rules as SpecForge applies them (tests/parity.rs checks them).

use crate::engine::data::Rng;
use crate::engine::gpu::cuda::upload;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// How far the anchor budget (`anchors`) reaches: each document of a packed row, or the row
/// as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnchorScope {
    /// Up to `anchors` per document: SpecForge's budget, which samples up to `num_anchors` per
    /// sequence and puts one conversation in a sequence. A row's anchors grow with the
    /// documents it packs.
    PerDoc,
    /// Up to `anchors` per packed row, shared by its documents in proportion to their
    /// candidates: a row costs the drafter the same however many documents it packs. The
    /// default: as good per target token as SpecForge's budget in python/peer/quality.py's
    /// table, at a fraction of the drafter's work (README, "Anchor budget").
    #[default]
    PerRow,
}

impl AnchorScope {
    pub fn parse(name: &str) -> Option<AnchorScope> {
        match name {
            "per-doc" => Some(AnchorScope::PerDoc),
            "per-row" => Some(AnchorScope::PerRow),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AnchorScope::PerDoc => "per-doc",
            AnchorScope::PerRow => "per-row",
        }
    }
}

/// The anchor candidates of one row, by document: positions p <= end - 2 of their document
/// whose token and next token carry loss (`loss_mask[p] && loss_mask[p + 1]`, SpecForge's
/// rule). A block may run past its document's end; those slots carry no label
/// (`block_labels`), so a document's last tokens, its end token included, are labels at every
/// slot.
fn candidates_by_doc(doc_ids: &[i64], loss_mask: &[bool]) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < doc_ids.len() {
        let end = start
            + doc_ids[start..]
                .iter()
                .take_while(|&&d| d == doc_ids[start])
                .count();
        out.push(
            (start..end.saturating_sub(1))
                .filter(|&p| loss_mask[p] && loss_mask[p + 1])
                .collect(),
        );
        start = end;
    }
    out
}

/// Moves a uniform sample without replacement of `take` items to the front (a partial
/// Fisher-Yates) and drops the rest.
fn sample_in_place(items: &mut Vec<usize>, take: usize, rng: &mut Rng) {
    let take = take.min(items.len());
    for i in 0..take {
        let j = i + rng.below((items.len() - i) as u64) as usize;
        items.swap(i, j);
    }
    items.truncate(take);
}

/// Anchors of one row: up to `budget` positions drawn uniformly without replacement from the
/// candidates of each document (`AnchorScope::PerDoc`) or of the whole row (`PerRow`). Sorted.
pub fn sample_anchors(
    doc_ids: &[i64],
    loss_mask: &[bool],
    budget: usize,
    scope: AnchorScope,
    rng: &mut Rng,
) -> Vec<i64> {
    let by_doc = candidates_by_doc(doc_ids, loss_mask);
    let mut picked: Vec<usize> = match scope {
        AnchorScope::PerDoc => by_doc
            .into_iter()
            .flat_map(|mut c| {
                sample_in_place(&mut c, budget, rng);
                c
            })
            .collect(),
        AnchorScope::PerRow => {
            let mut all: Vec<usize> = by_doc.into_iter().flatten().collect();
            sample_in_place(&mut all, budget, rng);
            all
        }
    };
    picked.sort_unstable();
    picked.into_iter().map(|p| p as i64).collect()
}

/// Anchors of every row, padded to `max` (the largest row's count) with `valid` false.
#[derive(Debug)]
pub struct Anchors {
    /// [b, a] positions (0 where invalid)
    pub pos: Tensor,
    /// [b, a] bool
    pub valid: Tensor,
    pub count: usize,
}

impl Anchors {
    /// A copy on `device`.
    pub fn to_device(&self, device: Device) -> Anchors {
        Anchors {
            pos: self.pos.to_device(device),
            valid: self.valid.to_device(device),
            count: self.count,
        }
    }
}

pub fn anchors_tensor(per_row: &[Vec<i64>], max: usize, device: Device) -> Anchors {
    let b = per_row.len();
    let mut pos = vec![0i64; b * max];
    let mut valid = vec![false; b * max];
    let mut count = 0;
    for (r, row) in per_row.iter().enumerate() {
        for (i, p) in row.iter().take(max).enumerate() {
            pos[r * max + i] = *p;
            valid[r * max + i] = true;
            count += 1;
        }
    }
    let shape = [b as i64, max as i64];
    Anchors {
        pos: upload(&Tensor::from_slice(&pos).view(shape), device),
        valid: upload(&Tensor::from_slice(&valid).view(shape), device),
        count,
    }
}

/// Position index of every block slot: `anchor + k`.
// anchors [b, a] -> [b, a, block]
fn slot_index(anchors: &Tensor, block: i64) -> Tensor {
    anchors.unsqueeze(-1) + Tensor::arange(block, (Kind::Int64, anchors.device()))
}

/// The block tokens: `[anchor token, MASK x (block-1)]` per anchor.
// input_ids [b, s], anchors [b, a] -> [b, a * block]
pub fn block_input_ids(
    input_ids: &Tensor,
    anchors: &Anchors,
    block: i64,
    mask_token: i64,
) -> Tensor {
    let (b, a) = (anchors.pos.size()[0], anchors.pos.size()[1]);
    let first = input_ids.gather(1, &anchors.pos, false).unsqueeze(-1);
    let rest = Tensor::full(
        [b, a, block - 1],
        mask_token,
        (Kind::Int64, input_ids.device()),
    );
    Tensor::cat(&[first, rest], -1).view([b, a * block])
}

/// Block positions: the anchor's position in its document plus k.
// positions [b, s], anchors [b, a] -> [b, a * block]
pub fn block_positions(positions: &Tensor, anchors: &Anchors, block: i64) -> Tensor {
    let (b, a) = (anchors.pos.size()[0], anchors.pos.size()[1]);
    let base = positions.gather(1, &anchors.pos, false).unsqueeze(-1);
    (base + Tensor::arange(block, (Kind::Int64, positions.device()))).view([b, a * block])
}

/// The block attention mask over keys `[context (s), blocks (a * block)]`: a block sees context
/// keys before its anchor in its own document, sees its own block both ways, and never another
/// block. An invalid (padding) block sees nothing: its rows are fully masked.
// doc_ids [b, s], anchors [b, a] -> [b, 1, a * block, s + a * block] bool
pub fn block_mask(doc_ids: &Tensor, anchors: &Anchors, block: i64) -> Tensor {
    let (b, s) = (doc_ids.size()[0], doc_ids.size()[1]);
    let a = anchors.pos.size()[1];
    let dev = doc_ids.device();
    let ctx = context_mask(doc_ids, anchors);
    let ctx = ctx
        .unsqueeze(2)
        .expand([b, a, block, s], false)
        .reshape([b, a * block, s]);
    let block_of = Tensor::arange(a, (Kind::Int64, dev)).repeat_interleave_self_int(block, 0, None);
    let own = block_of.unsqueeze(1).eq_tensor(&block_of.unsqueeze(0)); // [a*blk, a*blk]
    let valid_rows = anchors.valid.repeat_interleave_self_int(block, 1, None); // [b, a*blk]
    let blocks = own.unsqueeze(0).logical_and(&valid_rows.unsqueeze(-1)); // [b, a*blk, a*blk]
    Tensor::cat(&[ctx, blocks], -1).unsqueeze(1)
}

/// Which context keys each anchor's block sees: `kv < anchor`, same document, anchor valid.
// doc_ids [b, s], anchors [b, a] -> [b, a, s] bool
pub fn context_mask(doc_ids: &Tensor, anchors: &Anchors) -> Tensor {
    let s = doc_ids.size()[1];
    let anchor_doc = doc_ids.gather(1, &anchors.pos, false); // [b, a]
    let kv = Tensor::arange(s, (Kind::Int64, doc_ids.device())).view([1, 1, s]);
    let before = kv.lt_tensor(&anchors.pos.unsqueeze(-1)); // [b, a, s]
    let same_doc = doc_ids.unsqueeze(1).eq_tensor(&anchor_doc.unsqueeze(-1)); // [b, a, s]
    before
        .logical_and(&same_doc)
        .logical_and(&anchors.valid.unsqueeze(-1))
}

/// The block mask in tiles of anchors (what the drafter trains with), each tile's context
/// window planned from the host copies of the same anchors (`per_row`, as `anchors_tensor` took
/// them) and document ids (`[rows * seq]`).
pub fn tiled_block_mask(
    doc_ids: &Tensor,
    anchors: &Anchors,
    block: i64,
    per_row: &[Vec<i64>],
    host_doc_ids: &[i64],
) -> crate::engine::model::tiled::TiledMask {
    let (s, width) = (doc_ids.size()[1], anchors.pos.size()[1]);
    let plan = window_plan(per_row, width as usize, host_doc_ids, s);
    planned_block_mask(doc_ids, anchors, block, &plan)
}

/// The runs of tiles and their context windows for anchors `per_row` padded to `width` (a whole
/// number of tiles), over rows of `seq` tokens with document ids `host_doc_ids` (`[rows * seq]`).
pub fn window_plan(
    per_row: &[Vec<i64>],
    width: usize,
    host_doc_ids: &[i64],
    seq: i64,
) -> crate::engine::model::tiled::WindowPlan {
    use crate::engine::model::tiled::{context_spans, window_grid, WindowPlan};
    let spans = context_spans(per_row, width, host_doc_ids, seq as usize);
    WindowPlan::from_spans(&spans, per_row.len(), window_grid(seq), seq)
}

/// `tiled_block_mask` with the runs and windows of `plan` (one that holds every key the blocks
/// see: the batch's own plan, or one that covers it).
pub fn planned_block_mask(
    doc_ids: &Tensor,
    anchors: &Anchors,
    block: i64,
    plan: &crate::engine::model::tiled::WindowPlan,
) -> crate::engine::model::tiled::TiledMask {
    let ctx = context_mask(doc_ids, anchors);
    let mask = crate::engine::model::tiled::TiledMask::new(&ctx, &anchors.valid, block, plan);
    use crate::engine::gpu::fast_paths::{on, FastPath};
    if doc_ids.device().is_cuda() && on(FastPath::BlockAttention) {
        mask.with_block_spans(
            block_spans(&ctx, doc_ids, anchors),
            doc_ids.to_kind(Kind::Int),
        )
    } else {
        mask
    }
}

/// Each block's context keys as the block attention kernels take them (src/engine/gpu/cuda/
/// block_attention.rs): `[start, end)` holds every key `ctx` shows the block (from its first
/// to its anchor, the end exclusive; empty for a block that sees none), then the anchor's
/// document (a key in the span of another document is not seen) and 1 for a real block, 0 for
/// padding.
// ctx [b, a, s] bool (`context_mask`), doc_ids [b, s], anchors [b, a] -> [b, a, 4] int32
pub fn block_spans(ctx: &Tensor, doc_ids: &Tensor, anchors: &Anchors) -> Tensor {
    let seen = ctx.any_dim(-1, false);
    // The first key seen: argmax gives the first of equal maxima.
    let start = ctx.to_kind(Kind::Uint8).argmax(-1, false);
    let end = anchors.pos.where_self(&seen, &start);
    let doc = doc_ids.gather(1, &anchors.pos, false);
    let real = anchors.valid.to_kind(Kind::Int64);
    Tensor::stack(&[start, end, doc, real], -1).to_kind(Kind::Int)
}

/// Labels at `anchor + k` and where they carry loss: k >= 1, inside the row, in the anchor's
/// document, inside the loss mask, and the anchor valid.
// input_ids, doc_ids, loss_mask [b, s], anchors [b, a] -> ([b, a, block] i64, [b, a, block] bool)
pub fn block_labels(
    input_ids: &Tensor,
    doc_ids: &Tensor,
    loss_mask: &Tensor,
    anchors: &Anchors,
    block: i64,
) -> (Tensor, Tensor) {
    let (b, s) = (input_ids.size()[0], input_ids.size()[1]);
    let a = anchors.pos.size()[1];
    let idx = slot_index(&anchors.pos, block); // [b, a, blk]
    let inside = idx.lt(s);
    let flat = idx.clamp_max(s - 1).view([b, a * block]);
    let gather = |t: &Tensor| t.gather(1, &flat, false).view([b, a, block]);
    let labels = gather(input_ids);
    let anchor_doc = doc_ids.gather(1, &anchors.pos, false).unsqueeze(-1);
    let same_doc = gather(doc_ids).eq_tensor(&anchor_doc);
    let not_first = Tensor::arange(block, (Kind::Int64, input_ids.device())).ge(1);
    let valid = inside
        .logical_and(&same_doc)
        .logical_and(&gather(loss_mask))
        .logical_and(&not_first)
        .logical_and(&anchors.valid.unsqueeze(-1));
    (labels, valid)
}

/// The flat indices into `[rows, width, block]` of the labels that carry loss, from the host
/// copies (the rule of `block_labels`: k >= 1, inside the row, in the anchor's document, in the
/// loss mask), so that the loss knows its rows without reading them back from the device.
pub fn label_rows(
    per_row: &[Vec<i64>],
    width: usize,
    block: usize,
    doc_ids: &[i64],
    loss_mask: &[bool],
    seq: usize,
) -> Vec<i64> {
    let mut out = Vec::new();
    for (r, anchors) in per_row.iter().enumerate() {
        let row = r * seq;
        for (i, &p) in anchors.iter().take(width).enumerate() {
            let p = p as usize;
            for k in 1..block {
                let at = p + k;
                if at < seq && doc_ids[row + at] == doc_ids[row + p] && loss_mask[row + at] {
                    out.push(((r * width + i) * block + k) as i64);
                }
            }
        }
    }
    out
}
