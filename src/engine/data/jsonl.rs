//! Documents streamed from a JSONL file. Opening only indexes where each line starts (one pass,
//! a progress line when it takes over a second) and reads the first document, so that a bad
//! start fails at once; lines are then read, parsed and tokenized as the loader needs them —
//! ahead of it on a few threads (src/engine/data/jsonl/ahead.rs) — in an order drawn anew each
//! epoch from the seed. The stream position counts lines (blank and dropped ones too): a resumed
//! run skips to it without reading what it skips, and lands on the same document in every run
//! with that seed.

use super::chat::ChatOptions;
use super::tokenize::{line_doc, TextTokenizer};
use crate::engine::data::{Doc, DocSource, Rng};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

mod ahead;
use ahead::Ahead;

/// How a JSONL file becomes a stream of documents.
pub struct JsonlOptions {
    /// Token ids must lie below it.
    pub vocab_size: i64,
    /// The tokenizer.json that text and chat lines need.
    pub tokenizer: Option<PathBuf>,
    /// How chat lines are rendered (the TOML's `[chat]`).
    pub chat: ChatOptions,
    /// Documents with fewer loss tokens are dropped (the trainer asks for 2, SpecForge's
    /// minimum); so is one without two loss tokens in a row, on which no block trains. Every
    /// dropped document is counted (`on_dropped`).
    pub min_loss_tokens: usize,
    /// Some: a new order each epoch, drawn from this seed and the epoch; None: the file's order.
    pub seed: Option<u64>,
    /// Threads that read and tokenize ahead of the loader; 0: the loader reads each line itself.
    pub threads: usize,
    /// Told how many documents were dropped before each document given.
    pub on_dropped: Option<Box<dyn Fn(u64) + Send>>,
}

impl JsonlOptions {
    /// The file's order, read by the caller's thread, nothing dropped but what cannot train.
    pub fn new(vocab_size: i64) -> JsonlOptions {
        JsonlOptions {
            vocab_size,
            tokenizer: None,
            chat: ChatOptions::default(),
            min_loss_tokens: 0,
            seed: None,
            threads: 0,
            on_dropped: None,
        }
    }
}

/// Reading threads for a training run when `--data-threads` does not say: one per 8 cores, 1
/// to 4.
pub fn reading_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 8).clamp(1, 4)
}

/// What one line holds.
enum Item {
    Blank,
    /// Fewer than 2 tokens: not a document.
    Short,
    /// No two loss tokens in a row: no block could train on it.
    NoPair,
    /// Fewer loss tokens than `min_loss_tokens`.
    FewLoss,
    Doc(Doc),
}

/// The file's lines and how one becomes a document; shared by the reading threads.
struct Lines {
    path: PathBuf,
    file: File,
    /// Byte offset where each line starts, then the file's length.
    starts: Vec<u64>,
    vocab_size: i64,
    min_loss_tokens: usize,
    tokenizer_path: Option<PathBuf>,
    chat: ChatOptions,
    /// Opened at the first text or chat line (an error is kept as its sentence).
    tokenizer: OnceLock<std::result::Result<TextTokenizer, String>>,
    /// Lines parsed so far, ahead of the loader too.
    parsed: AtomicU64,
}

impl Lines {
    fn count(&self) -> u64 {
        self.starts.len() as u64 - 1
    }

    fn item(&self, line: usize) -> Result<Item> {
        let at = || format!("{} line {}", self.path.display(), line + 1);
        let (start, end) = (self.starts[line], self.starts[line + 1]);
        let mut buf = vec![0; (end - start) as usize];
        self.file
            .read_exact_at(&mut buf, start)
            .with_context(|| format!("{}: cannot read it (did the file change?)", at()))?;
        self.parsed.fetch_add(1, Ordering::Relaxed);
        let text = std::str::from_utf8(&buf)
            .ok()
            .with_context(|| format!("{}: not UTF-8 text", at()))?
            .trim();
        if text.is_empty() {
            return Ok(Item::Blank);
        }
        let v: serde_json::Value =
            serde_json::from_str(text).with_context(|| format!("{}: not valid JSON", at()))?;
        let doc = line_doc(&v, self.vocab_size, || self.tokenizer()).with_context(at)?;
        let loss = doc.loss_mask.iter().filter(|&&l| l).count();
        Ok(if doc.ids.len() < 2 {
            Item::Short
        } else if !doc.loss_mask.windows(2).any(|w| w[0] && w[1]) {
            Item::NoPair
        } else if loss < self.min_loss_tokens {
            Item::FewLoss
        } else {
            Item::Doc(doc)
        })
    }

    fn tokenizer(&self) -> Result<&TextTokenizer> {
        let Some(path) = &self.tokenizer_path else {
            bail!(
                "text and chat lines need a tokenizer: give --target DIR with a tokenizer.json, \
                 or pre-tokenize to `input_ids`"
            );
        };
        let opened = self.tokenizer.get_or_init(|| {
            TextTokenizer::open_with(path, self.chat.clone()).map_err(|e| format!("{e:#}"))
        });
        opened.as_ref().map_err(|e| anyhow::anyhow!("{e}"))
    }
}

/// Where each line of `path` starts, then its length.
fn index_lines(path: &Path) -> Result<(File, Vec<u64>)> {
    let cannot = || format!("cannot read data file {}: check --data", path.display());
    let mut file = File::open(path).with_context(cannot)?;
    let len = file.metadata().with_context(cannot)?.len();
    let mut starts = vec![0];
    let mut buf = vec![0; 1 << 22];
    let mut read = 0u64;
    let mut ticker = crate::progress::Ticker::new();
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(cannot),
        };
        starts.extend(memchr::memchr_iter(b'\n', &buf[..n]).map(|i| read + i as u64 + 1));
        read += n as u64;
        ticker.tick(|secs| {
            format!(
                "data: indexing {}: {} lines, {:.0}% ({secs:.0}s)",
                path.display(),
                starts.len() - 1,
                100.0 * read as f64 / len.max(1) as f64
            )
        });
    }
    if starts.last() != Some(&read) {
        starts.push(read); // the last line has no newline
    }
    if ticker.took_long() {
        eprintln!(
            "data: {} lines of {} indexed in {:.1}s",
            starts.len() - 1,
            path.display(),
            ticker.seconds()
        );
    }
    Ok((file, starts))
}

/// Which line a stream position reads: epoch `pos / lines`, in that epoch's order.
struct Order {
    lines: u64,
    seed: Option<u64>,
    /// Permutations of the epochs in use (positions only move on: older ones are let go).
    epochs: BTreeMap<u64, Vec<u32>>,
}

impl Order {
    fn line(&mut self, pos: u64) -> usize {
        let (epoch, i) = (pos / self.lines, (pos % self.lines) as usize);
        let Some(seed) = self.seed else { return i };
        if !self.epochs.contains_key(&epoch) {
            self.epochs.retain(|&e, _| e > epoch);
            let mut order: Vec<u32> = (0..self.lines as u32).collect();
            let mut rng = Rng::new(seed ^ epoch.wrapping_mul(0xA24B_AED4_963E_E407));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            self.epochs.insert(epoch, order);
        }
        self.epochs[&epoch][i] as usize
    }
}

/// Documents from a JSONL file, streamed and cycled. Each line is one of:
/// - `{"input_ids": [...], "loss_mask": [...]}` (loss_mask optional, 0/1 or booleans), the format
///   hidden-state preparation tools emit;
/// - `{"text": "..."}`: tokenized with the target's tokenizer.json, every token with loss;
/// - `{"messages": [{"role": ..., "content": ...}, ...]}`: rendered with the tokenizer's own chat
///   template (tokenizer_config.json `chat_template` or chat_template.jinja beside tokenizer.json)
///   and tokenized whole; a tokenizer without a template refuses chat lines; the loss mask covers
///   the assistant turns' content and the end token right after it (our reading of "loss mask =
///   assistant turns").
///
/// A bad line is an error naming the file and line when the stream reaches it.
pub struct JsonlSource {
    lines: Arc<Lines>,
    order: Order,
    ahead: Option<Ahead>,
    /// The stream position after the documents given so far.
    given: u64,
    /// The next document (read at open), the position after it, and the documents dropped
    /// before it.
    ready: Option<(Doc, u64, u64)>,
    on_dropped: Option<Box<dyn Fn(u64) + Send>>,
}

impl JsonlSource {
    /// Indexes `path` and reads its first document (in the seed's order).
    pub fn open(path: &Path, opts: JsonlOptions) -> Result<JsonlSource> {
        let (file, starts) = index_lines(path)?;
        let lines = Arc::new(Lines {
            path: path.to_path_buf(),
            file,
            starts,
            vocab_size: opts.vocab_size,
            min_loss_tokens: opts.min_loss_tokens,
            tokenizer_path: opts.tokenizer,
            chat: opts.chat,
            tokenizer: OnceLock::new(),
            parsed: AtomicU64::new(0),
        });
        if lines.count() == 0 {
            bail!(
                "{} is empty: give --data a JSONL file with one document a line",
                path.display()
            );
        }
        if lines.count() > u32::MAX as u64 {
            bail!(
                "{} has more than {} lines: split it",
                path.display(),
                u32::MAX
            );
        }
        let ahead = match opts.threads {
            0 => None,
            n => Some(Ahead::start(&lines, n)?),
        };
        let mut src = JsonlSource {
            order: Order {
                lines: lines.count(),
                seed: opts.seed,
                epochs: BTreeMap::new(),
            },
            lines,
            ahead,
            given: 0,
            ready: None,
            on_dropped: opts.on_dropped,
        };
        src.ready = Some(src.scan(0)?);
        Ok(src)
    }

    /// Lines parsed so far (by the reading threads too): how far ahead of the stream reading got.
    pub fn lines_parsed(&self) -> u64 {
        self.lines.parsed.load(Ordering::Relaxed)
    }

    fn item(&mut self, pos: u64) -> Result<Item> {
        match &mut self.ahead {
            Some(ahead) => ahead.get(pos, &mut self.order),
            None => {
                let line = self.order.line(pos);
                self.lines.item(line)
            }
        }
    }

    /// The next document from position `from`, the position after it, and the documents
    /// dropped before it. A whole epoch without one is an error that says why.
    fn scan(&mut self, from: u64) -> Result<(Doc, u64, u64)> {
        let (mut no_pair, mut few, mut short) = (0u64, 0u64, 0u64);
        for pos in from..from + self.lines.count() {
            match self.item(pos)? {
                Item::Doc(doc) => return Ok((doc, pos + 1, no_pair + few + short)),
                Item::Blank => {}
                Item::Short => short += 1,
                Item::NoPair => no_pair += 1,
                Item::FewLoss => few += 1,
            }
        }
        let path = self.lines.path.display();
        let min = self.lines.min_loss_tokens;
        if few > 0 {
            bail!(
                "{path}: every document has fewer than {min} loss tokens: no block could be \
                 trained; give longer replies"
            );
        }
        if no_pair > 0 {
            bail!(
                "{path} has no line with two consecutive loss tokens: no block could be trained; \
                 check its `loss_mask` (1 on the tokens to learn)"
            );
        }
        bail!("{path} holds no document with at least 2 tokens: give --data a non-empty JSONL file")
    }
}

impl DocSource for JsonlSource {
    fn next_doc(&mut self) -> Result<Doc> {
        let (doc, after, dropped) = match self.ready.take() {
            Some(ready) => ready,
            None => self.scan(self.given)?,
        };
        self.given = after;
        if let (Some(tell), 1..) = (&self.on_dropped, dropped) {
            tell(dropped);
        }
        Ok(doc)
    }

    fn position(&self) -> u64 {
        self.given
    }

    fn skip(&mut self, n: u64) -> Result<()> {
        if n > 0 {
            self.ready = None;
            self.given += n;
        }
        Ok(())
    }
}
