//! Data: documents from a source, packed into fixed-length rows with document ids and
//! per-document positions.

use anyhow::{bail, Context, Result};
use std::path::Path;
use tch::{Kind, Tensor};

/// One document: token ids and which of them carry loss.
#[derive(Clone, Debug, PartialEq)]
pub struct Doc {
    pub ids: Vec<i64>,
    pub loss_mask: Vec<bool>,
}

/// Where documents come from. Sources cycle: they never run dry.
pub trait DocSource: Send {
    fn next_doc(&mut self) -> Doc;

    /// Skips `n` documents (a resumed run continues where its data stood).
    fn skip(&mut self, n: u64) {
        for _ in 0..n {
            self.next_doc();
        }
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
        }
    }
}

impl DocSource for Synthetic {
    fn next_doc(&mut self) -> Doc {
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
        Doc { ids, loss_mask }
    }
}

/// Documents from a JSONL file, read once, then cycled. Each line is one of:
/// - `{"input_ids": [...], "loss_mask": [...]}` (loss_mask optional, 0/1 or booleans), the format
///   hidden-state preparation tools emit;
/// - `{"text": "..."}`: tokenized with the target's tokenizer.json, every token with loss;
/// - `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the tokenizer's own chat
///   template (tokenizer_config.json `chat_template` or chat_template.jinja beside tokenizer.json)
///   and tokenized whole; a tokenizer without a template refuses chat lines; the loss mask covers
///   the assistant turns' content and the end token right after it (our reading of "loss mask =
///   assistant turns").
///
/// `shuffled(seed)` visits the documents in a fresh order each epoch (a permutation drawn from
/// the seed and the epoch number), so a position in the stream (`skip`) lands on the same
/// document in every run with that seed: a resumed run continues exactly.
pub struct JsonlSource {
    docs: Vec<Doc>,
    /// Order of this epoch (identity when not shuffled).
    order: Vec<usize>,
    /// Next index into `order`.
    next: usize,
    epoch: u64,
    /// None: the file's order, every epoch.
    seed: Option<u64>,
}

/// Turns a text or chat line into a document (and, for `generate`, a prompt into ids).
pub struct TextTokenizer {
    tok: tokenizers::Tokenizer,
    /// The model directory's own chat template, when it has one.
    template: Option<super::chat::ChatTemplate>,
    /// The directory of tokenizer.json, for messages.
    dir: std::path::PathBuf,
}

impl TextTokenizer {
    pub fn open(path: &Path) -> Result<TextTokenizer> {
        let tok = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            anyhow::anyhow!(
                "cannot read tokenizer {}: {e}; text data needs the target's tokenizer.json",
                path.display()
            )
        })?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let template = super::chat::ChatTemplate::find(&dir)?;
        Ok(TextTokenizer { tok, template, dir })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        Ok(enc.get_ids().iter().map(|&i| i as i64).collect())
    }

    fn text(&self, text: &str) -> Result<Doc> {
        let ids = self.encode(text)?;
        Ok(Doc {
            loss_mask: vec![true; ids.len()],
            ids,
        })
    }

    /// A conversation through the tokenizer's chat template; the loss mask covers the tokens of
    /// the assistant turns (`chat::assistant_spans`).
    fn templated_chat(
        &self,
        template: &super::chat::ChatTemplate,
        messages: &[serde_json::Value],
    ) -> Result<Doc> {
        let text = template.render(messages)?;
        let specials: Vec<String> = self
            .tok
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect();
        let spans = super::chat::assistant_spans(&text, messages, &specials);
        let enc = self
            .tok
            .encode(text.as_str(), false)
            .map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?;
        let loss_mask = enc
            .get_offsets()
            .iter()
            .map(|&(s, e)| spans.iter().any(|r| s < r.end && e > r.start))
            .collect();
        Ok(Doc {
            ids: enc.get_ids().iter().map(|&i| i as i64).collect(),
            loss_mask,
        })
    }

    fn chat(&self, messages: &[serde_json::Value]) -> Result<Doc> {
        self.templated_chat(self.chat_template()?, messages)
    }

    /// The chat template chat data goes through; a tokenizer without one refuses chat data (a
    /// hand-written format would train the drafter on text its target never sees).
    pub fn chat_template(&self) -> Result<&super::chat::ChatTemplate> {
        self.template.as_ref().with_context(|| {
            let dir = self.dir.display();
            format!(
                "chat data (`messages`) needs the tokenizer's chat template, and the tokenizer \
                 in {dir} has none (no `chat_template` in {dir}/tokenizer_config.json, no \
                 {dir}/chat_template.jinja): give a tokenizer with a chat_template, or \
                 pre-tokenized `input_ids` + `loss_mask` lines"
            )
        })
    }
}

impl JsonlSource {
    /// `tokenizer`: the tokenizer.json that text and chat lines need.
    pub fn open(path: &Path, vocab_size: i64, tokenizer: Option<&Path>) -> Result<JsonlSource> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read data file {}: check --data", path.display()))?;
        let mut tok: Option<TextTokenizer> = None;
        let mut docs = Vec::new();
        let mut ticker = crate::progress::Ticker::new();
        let mut read = 0;
        for (n, line) in text.lines().enumerate() {
            read += line.len() + 1;
            ticker.tick(|secs| {
                format!(
                    "data: {} documents from {} ({:.0}% read, {secs:.0}s)",
                    docs.len(),
                    path.display(),
                    100.0 * read as f64 / text.len().max(1) as f64
                )
            });
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let at = || format!("{} line {}", path.display(), n + 1);
            let v: serde_json::Value =
                serde_json::from_str(line).with_context(|| format!("{}: not valid JSON", at()))?;
            let doc = if let Some(ids) = v.get("input_ids") {
                ids_doc(ids, v.get("loss_mask"), vocab_size).with_context(at)?
            } else if v.get("text").is_some() || v.get("messages").is_some() {
                if tok.is_none() {
                    let Some(p) = tokenizer else {
                        bail!(
                            "{}: text and chat lines need a tokenizer: give --target DIR with a \
                             tokenizer.json, or pre-tokenize to `input_ids`",
                            at()
                        );
                    };
                    tok = Some(TextTokenizer::open(p)?);
                }
                let t = tok.as_ref().expect("opened above");
                let doc = match (
                    v.get("text").and_then(|x| x.as_str()),
                    v.get("messages").and_then(|x| x.as_array()),
                ) {
                    (Some(s), _) => t.text(s),
                    (None, Some(m)) => t.chat(m),
                    _ => Err(anyhow::anyhow!(
                        "`text` must be a string and `messages` a list"
                    )),
                }
                .with_context(at)?;
                if let Some(bad) = doc.ids.iter().find(|&&i| i >= vocab_size) {
                    bail!("{}: the tokenizer gave id {bad}, outside the target's vocabulary ({vocab_size})", at());
                }
                doc
            } else {
                bail!(
                    "{}: no `input_ids`, `text` or `messages`: each line needs one",
                    at()
                );
            };
            if doc.ids.len() >= 2 {
                docs.push(doc);
            }
        }
        if ticker.took_long() {
            eprintln!(
                "data: {} documents from {} in {:.1}s",
                docs.len(),
                path.display(),
                ticker.seconds()
            );
        }
        if docs.is_empty() {
            bail!(
                "{} holds no document with at least 2 tokens: give --data a non-empty JSONL file",
                path.display()
            );
        }
        let trains = |d: &Doc| d.loss_mask.windows(2).any(|w| w[0] && w[1]);
        if !docs.iter().any(trains) {
            bail!(
                "{} has no line with two consecutive loss tokens: no block could be trained; \
                 check its `loss_mask` (1 on the tokens to learn)",
                path.display()
            );
        }
        let order = (0..docs.len()).collect();
        Ok(JsonlSource {
            docs,
            order,
            next: 0,
            epoch: 0,
            seed: None,
        })
    }

    /// Drops the documents with fewer than `min` loss tokens (SpecForge drops samples with fewer
    /// than 2 x block); returns how many went. None left is an error naming the file.
    pub fn keep_trainable(&mut self, min: usize, path: &Path) -> Result<u64> {
        let before = self.docs.len();
        self.docs
            .retain(|d| d.loss_mask.iter().filter(|&&l| l).count() >= min);
        if self.docs.is_empty() {
            bail!(
                "{}: every document has fewer than {min} loss tokens (2 x the block size): no \
                 block could be trained well; give longer replies or a smaller --block-size",
                path.display()
            );
        }
        self.start_epoch(0);
        Ok((before - self.docs.len()) as u64)
    }

    /// The same documents in a seeded order, drawn anew each epoch.
    pub fn shuffled(mut self, seed: u64) -> JsonlSource {
        self.seed = Some(seed);
        self.start_epoch(0);
        self
    }

    fn start_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
        self.next = 0;
        self.order = (0..self.docs.len()).collect();
        if let Some(seed) = self.seed {
            let mut rng = Rng::new(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407));
            for i in (1..self.order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                self.order.swap(i, j);
            }
        }
    }
}

fn ids_doc(
    ids: &serde_json::Value,
    mask: Option<&serde_json::Value>,
    vocab_size: i64,
) -> Result<Doc> {
    let ids: Vec<i64> = ids
        .as_array()
        .context("`input_ids` must be an array")?
        .iter()
        .map(|x| x.as_i64().filter(|t| (0..vocab_size).contains(t)))
        .collect::<Option<_>>()
        .with_context(|| format!("`input_ids` must be integers in 0..{vocab_size}"))?;
    let loss_mask = match mask.and_then(|x| x.as_array()) {
        None => vec![true; ids.len()],
        Some(m) => {
            if m.len() != ids.len() {
                bail!(
                    "`loss_mask` has {} entries but `input_ids` has {}",
                    m.len(),
                    ids.len()
                );
            }
            m.iter()
                .map(|x| x.as_bool().unwrap_or(x.as_i64().unwrap_or(0) != 0))
                .collect()
        }
    };
    Ok(Doc { ids, loss_mask })
}

impl DocSource for JsonlSource {
    fn next_doc(&mut self) -> Doc {
        if self.next == self.docs.len() {
            self.start_epoch(self.epoch + 1);
        }
        let d = self.docs[self.order[self.next]].clone();
        self.next += 1;
        d
    }

    fn skip(&mut self, n: u64) {
        let len = self.docs.len() as u64;
        let at = self.epoch * len + self.next as u64 + n;
        let (epoch, next) = (at / len, (at % len) as usize);
        if epoch != self.epoch {
            self.start_epoch(epoch);
        }
        self.next = next;
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
    /// Documents the source had given when this batch was complete (the data position after it).
    pub docs_placed: u64,
    /// Documents of this batch truncated to the row length.
    pub truncated: u64,
}

impl PackedBatch {
    /// The same batch with its tensors on `device` (host copies kept).
    pub fn to_device(self, device: tch::Device) -> PackedBatch {
        PackedBatch {
            input_ids: self.input_ids.to_device(device),
            positions: self.positions.to_device(device),
            doc_ids: self.doc_ids.to_device(device),
            loss_mask: self.loss_mask.to_device(device),
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
    /// The document that did not fit in the previous row (and whether it was truncated).
    pending: Option<(Doc, bool)>,
    /// Documents taken from the source so far.
    drawn: u64,
    /// Documents placed in rows truncated so far.
    pub truncated: u64,
}

impl Default for Packer {
    fn default() -> Self {
        Self::new()
    }
}

/// One packed row on the host.
pub struct Row {
    pub ids: Vec<i64>,
    pub loss_mask: Vec<bool>,
    /// Lengths of the documents, then of the padding when there is any.
    pub lengths: Vec<i64>,
}

impl Packer {
    pub fn new() -> Packer {
        Packer::starting_at(0)
    }

    /// A packer whose source has already given `docs` documents (a resumed run).
    pub fn starting_at(docs: u64) -> Packer {
        Packer {
            pending: None,
            drawn: docs,
            truncated: 0,
        }
    }

    /// Documents placed in rows so far: the data position a resumed run skips to.
    pub fn docs_placed(&self) -> u64 {
        self.drawn - self.pending.is_some() as u64
    }

    /// The next document, truncated to `seq`; true when it was.
    fn draw(&mut self, src: &mut dyn DocSource, seq: usize) -> (Doc, bool) {
        let mut doc = src.next_doc();
        self.drawn += 1;
        let cut = doc.ids.len() > seq;
        if cut {
            doc.ids.truncate(seq);
            doc.loss_mask.truncate(seq);
        }
        (doc, cut)
    }

    /// Fills one row with whole documents, then padding.
    pub fn fill_row(&mut self, src: &mut dyn DocSource, seq: usize) -> Row {
        let mut row = Row {
            ids: Vec::with_capacity(seq),
            loss_mask: Vec::with_capacity(seq),
            lengths: Vec::new(),
        };
        while row.ids.len() < seq {
            let (doc, cut) = match self.pending.take() {
                Some(d) => d,
                None => self.draw(src, seq),
            };
            if doc.ids.len() > seq - row.ids.len() {
                self.pending = Some((doc, cut)); // never in an empty row: a document fits a row
                break;
            }
            self.truncated += cut as u64;
            row.lengths.push(doc.ids.len() as i64);
            row.ids.extend(doc.ids);
            row.loss_mask.extend(doc.loss_mask);
        }
        let pad = seq - row.ids.len();
        if pad > 0 {
            row.lengths.push(pad as i64);
            row.ids.extend(std::iter::repeat_n(0, pad));
            row.loss_mask.extend(std::iter::repeat_n(false, pad));
        }
        row
    }

    pub fn pack(&mut self, src: &mut dyn DocSource, rows: i64, seq: i64) -> PackedBatch {
        let truncated_before = self.truncated;
        let mut all_ids = Vec::with_capacity((rows * seq) as usize);
        let mut all_mask = Vec::with_capacity((rows * seq) as usize);
        let mut doc_rows = Vec::with_capacity(rows as usize);
        let mut pos_rows = Vec::with_capacity(rows as usize);
        for _ in 0..rows {
            let row = self.fill_row(src, seq as usize);
            let (doc_ids, positions) = doc_ids_and_positions(&row.lengths);
            doc_rows.push(doc_ids);
            pos_rows.push(positions);
            all_ids.extend(row.ids);
            all_mask.extend(row.loss_mask);
        }
        let doc_ids = Tensor::stack(&doc_rows, 0);
        let host_doc_ids = Vec::<i64>::try_from(doc_ids.flatten(0, -1)).unwrap_or_default();
        PackedBatch {
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
        }
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
