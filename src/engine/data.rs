//! Data: documents from a source, packed into fixed-length rows with document ids and
//! per-document positions.

pub mod chat;
pub mod jsonl;
pub mod tokenize;

use crate::engine::gpu::cuda::upload;
use anyhow::Result;
use tch::{Kind, Tensor};

/// One document: token ids and which of them carry loss.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub ids: Vec<i64>,
    pub loss_mask: Vec<bool>,
}

/// Where documents come from. Sources cycle: they never run dry; reading one can fail (a bad
/// line of a file, named when the stream reaches it).
pub trait DocSource: Send {
    fn next_doc(&mut self) -> Result<Doc>;

    /// Where the stream stands after the documents given so far: documents, or for a file its
    /// lines (blank and dropped ones too). A resumed run `skip`s to it.
    fn position(&self) -> u64;

    /// Moves `n` places on (a resumed run continues where its data stood).
    fn skip(&mut self, n: u64) -> Result<()> {
        for _ in 0..n {
            self.next_doc()?;
        }
        Ok(())
    }
}

/// A small, fast, seeded generator (SplitMix64): data must not depend on libtorch's RNG state.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// The generator's state, to save; `from_state` continues from it.
    pub fn state(&self) -> u64 {
        self.0
    }

    pub fn from_state(state: u64) -> Rng {
        Rng(state)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / ((1u64 << 53) as f64)) < p
    }
}

/// Synthetic documents with learnable structure: each token is followed by a fixed successor
/// (a random permutation of the vocabulary) with probability `follow`, by a random token
/// otherwise. A drafter that learns the successor map predicts many tokens ahead, so the loss
/// falls and tau rises within minutes on a CPU. The first `prompt` tokens carry no loss, like a
/// chat prompt.
pub struct Synthetic {
    rng: Rng,
    successor: Vec<i64>,
    vocab: u64,
    follow: f64,
    min_len: u64,
    max_len: u64,
    prompt: usize,
    /// Documents given so far.
    given: u64,
}

impl Synthetic {
    /// `vocab` excludes reserved ids (the mask token sits above it).
    pub fn new(seed: u64, vocab: i64, max_len: i64) -> Synthetic {
        let mut rng = Rng::new(seed);
        let vocab = vocab.max(2) as u64;
        let mut successor: Vec<i64> = (0..vocab as i64).collect();
        for i in (1..successor.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            successor.swap(i, j);
        }
        let max_len = (max_len.max(8)) as u64;
        Synthetic {
            rng: Rng::new(seed.wrapping_add(1)),
            successor,
            vocab,
            follow: 0.9,
            min_len: (max_len / 4).max(4),
            max_len,
            prompt: 4,
            given: 0,
        }
    }
}

impl DocSource for Synthetic {
    fn position(&self) -> u64 {
        self.given
    }

    fn next_doc(&mut self) -> Result<Doc> {
        self.given += 1;
        let len = self.min_len + self.rng.below(self.max_len - self.min_len + 1);
        let mut ids = Vec::with_capacity(len as usize);
        let mut t = self.rng.below(self.vocab) as i64;
        for _ in 0..len {
            ids.push(t);
            t = if self.rng.chance(self.follow) {
                self.successor[t as usize]
            } else {
                self.rng.below(self.vocab) as i64
            };
        }
        let loss_mask = (0..ids.len()).map(|i| i >= self.prompt).collect();
        Ok(Doc { ids, loss_mask })
    }
}

/// Rank `rank`'s share of a source in a job of `world` processes: documents rank, rank + world,
/// rank + 2 world, ... of the stream, so that no two ranks train on the same document.
pub struct Sharded {
    inner: Box<dyn DocSource>,
    rank: u64,
    world: u64,
    started: bool,
}

impl Sharded {
    pub fn new(inner: Box<dyn DocSource>, rank: u32, world: u32) -> Sharded {
        Sharded {
            inner,
            rank: rank as u64,
            world: world.max(1) as u64,
            started: false,
        }
    }
}

impl DocSource for Sharded {
    fn next_doc(&mut self) -> Result<Doc> {
        let before = if self.started {
            self.world - 1
        } else {
            self.rank
        };
        self.started = true;
        self.inner.skip(before)?;
        self.inner.next_doc()
    }

    /// The whole stream's position (a resumed rank skips the stream to it, then takes its share).
    fn position(&self) -> u64 {
        self.inner.position()
    }
}

/// A packed batch on the host: `rows` rows of `seq` tokens.
#[derive(Debug)]
pub struct PackedBatch {
    pub rows: i64,
    pub seq: i64,
    pub input_ids: Tensor,
    pub positions: Tensor,
    pub doc_ids: Tensor,
    pub loss_mask: Tensor,
    /// Host copies the drafter samples anchors from.
    pub host_doc_ids: Vec<i64>,
    pub host_loss_mask: Vec<bool>,
    /// The source's position after the documents placed so far (documents; a file's lines): the
    /// data position after this batch, where a resumed run continues.
    pub docs_placed: u64,
    /// Documents of this batch truncated to the row length.
    pub truncated: u64,
    /// Tokens of the documents in it (the rows less their padding).
    pub doc_tokens: u64,
}

impl PackedBatch {
    /// The same batch with its tensors on `device` (host copies kept; from the host without a
    /// stream sync, see `cuda::upload`).
    pub fn to_device(self, device: tch::Device) -> PackedBatch {
        PackedBatch {
            input_ids: upload(&self.input_ids, device),
            positions: upload(&self.positions, device),
            doc_ids: upload(&self.doc_ids, device),
            loss_mask: upload(&self.loss_mask, device),
            ..self
        }
    }

    /// Target input tokens in the batch.
    pub fn tokens(&self) -> u64 {
        (self.rows * self.seq) as u64
    }
}

/// Packs whole documents into rows: documents are concatenated while they fit; one that does
/// not fit in what is left of a row starts the next row; the rest of the row is padding (token 0,
/// no loss, a document id of its own). A document longer than a row is truncated to the row
/// (counted in `truncated`), as SpecForge truncates a sample to `max_length`.
pub struct Packer {
    /// The document that did not fit in the previous row.
    pending: Option<Drawn>,
    /// The source's position after the documents placed so far.
    placed: u64,
    /// Documents placed in rows truncated so far.
    pub truncated: u64,
}

impl Default for Packer {
    fn default() -> Self {
        Self::new()
    }
}

/// A document taken from the source, truncated to a row.
struct Drawn {
    doc: Doc,
    /// Whether it was truncated.
    cut: bool,
    /// The source's position after it.
    after: u64,
}

/// One packed row on the host.
pub struct Row {
    pub ids: Vec<i64>,
    pub loss_mask: Vec<bool>,
    /// Lengths of the documents, then of the padding when there is any.
    pub lengths: Vec<i64>,
    /// Tokens of its documents (the row less its padding).
    pub doc_tokens: usize,
}

impl Packer {
    pub fn new() -> Packer {
        Packer::starting_at(0)
    }

    /// A packer whose source stands at `position` (a resumed run).
    pub fn starting_at(position: u64) -> Packer {
        Packer {
            pending: None,
            placed: position,
            truncated: 0,
        }
    }

    /// The source's position after the documents placed in rows so far: the data position a
    /// resumed run skips to.
    pub fn docs_placed(&self) -> u64 {
        self.placed
    }

    /// The next document, truncated to `seq`.
    fn draw(src: &mut dyn DocSource, seq: usize) -> Result<Drawn> {
        let mut doc = src.next_doc()?;
        let cut = doc.ids.len() > seq;
        if cut {
            doc.ids.truncate(seq);
            doc.loss_mask.truncate(seq);
        }
        Ok(Drawn {
            doc,
            cut,
            after: src.position(),
        })
    }

    /// Fills one row with whole documents, then padding.
    pub fn fill_row(&mut self, src: &mut dyn DocSource, seq: usize) -> Result<Row> {
        let mut row = Row {
            ids: Vec::with_capacity(seq),
            loss_mask: Vec::with_capacity(seq),
            lengths: Vec::new(),
            doc_tokens: 0,
        };
        while row.ids.len() < seq {
            let drawn = match self.pending.take() {
                Some(d) => d,
                None => Packer::draw(src, seq)?,
            };
            if drawn.doc.ids.len() > seq - row.ids.len() {
                self.pending = Some(drawn); // never in an empty row: a document fits a row
                break;
            }
            let Drawn { doc, cut, after } = drawn;
            self.truncated += cut as u64;
            self.placed = after;
            row.lengths.push(doc.ids.len() as i64);
            row.ids.extend(doc.ids);
            row.loss_mask.extend(doc.loss_mask);
        }
        row.doc_tokens = row.ids.len();
        let pad = seq - row.ids.len();
        if pad > 0 {
            row.lengths.push(pad as i64);
            row.ids.extend(std::iter::repeat_n(0, pad));
            row.loss_mask.extend(std::iter::repeat_n(false, pad));
        }
        Ok(row)
    }

    /// A batch of `rows` rows of `seq` tokens; fails when the source does (a bad line).
    pub fn pack(&mut self, src: &mut dyn DocSource, rows: i64, seq: i64) -> Result<PackedBatch> {
        let truncated_before = self.truncated;
        let mut all_ids = Vec::with_capacity((rows * seq) as usize);
        let mut all_mask = Vec::with_capacity((rows * seq) as usize);
        let mut doc_rows = Vec::with_capacity(rows as usize);
        let mut pos_rows = Vec::with_capacity(rows as usize);
        let mut doc_tokens = 0;
        for _ in 0..rows {
            let row = self.fill_row(src, seq as usize)?;
            doc_tokens += row.doc_tokens as u64;
            let (doc_ids, positions) = doc_ids_and_positions(&row.lengths);
            doc_rows.push(doc_ids);
            pos_rows.push(positions);
            all_ids.extend(row.ids);
            all_mask.extend(row.loss_mask);
        }
        let doc_ids = Tensor::stack(&doc_rows, 0);
        let host_doc_ids = Vec::<i64>::try_from(doc_ids.flatten(0, -1)).unwrap_or_default();
        Ok(PackedBatch {
            rows,
            seq,
            input_ids: Tensor::from_slice(&all_ids).view([rows, seq]),
            positions: Tensor::stack(&pos_rows, 0),
            doc_ids,
            loss_mask: Tensor::from_slice(&all_mask).view([rows, seq]),
            host_doc_ids,
            host_loss_mask: all_mask,
            docs_placed: self.docs_placed(),
            truncated: self.truncated - truncated_before,
            doc_tokens,
        })
    }
}

/// `document_ids = repeat_interleave(arange(n_docs), lengths)`; positions restart per document.
// lengths [n_docs] -> ([seq], [seq])
pub fn doc_ids_and_positions(lengths: &[i64]) -> (Tensor, Tensor) {
    let lengths = Tensor::from_slice(lengths);
    let n = lengths.size()[0];
    let doc_ids = Tensor::arange(n, (Kind::Int64, tch::Device::Cpu))
        .repeat_interleave_self_tensor(&lengths, 0, None);
    let starts = lengths.cumsum(0, Kind::Int64) - &lengths;
    let seq = doc_ids.size()[0];
    let positions =
        Tensor::arange(seq, (Kind::Int64, tch::Device::Cpu)) - starts.index_select(0, &doc_ids);
    (doc_ids, positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_of_a_stream_are_disjoint_and_together_the_whole_stream() {
        let whole: Vec<Vec<i64>> = {
            let mut s = Synthetic::new(5, 500, 64);
            (0..12).map(|_| s.next_doc().unwrap().ids).collect()
        };
        let world = 3;
        let shards: Vec<Vec<Vec<i64>>> = (0..world)
            .map(|rank| {
                let mut s = Sharded::new(Box::new(Synthetic::new(5, 500, 64)), rank, world);
                (0..4).map(|_| s.next_doc().unwrap().ids).collect()
            })
            .collect();
        for (i, doc) in whole.iter().enumerate() {
            let (rank, k) = (i % world as usize, i / world as usize);
            assert_eq!(&shards[rank][k], doc, "document {i} is rank {rank}'s {k}th");
        }
    }
}
