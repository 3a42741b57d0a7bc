//! `dflash-top generate`: the target's own continuations of prompts, written as training data
//! (`input_ids` + `loss_mask`: 0 on the prompt, 1 on what the target wrote), the usual practice
//! for training a drafter on what its target actually says.

use crate::config::cli::GenerateArgs;
use crate::engine::data::tokenize::TextTokenizer;
use crate::engine::model::decode::{continuations, Decoding};
use crate::engine::model::qwen3::Qwen3Target;
use crate::engine::model::shapes::Qwen3Config;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;
use tch::{nn::VarStore, Kind};

pub fn run(args: &GenerateArgs) -> Result<ExitCode> {
    let device = checked_device(args)?;
    let cfg = Qwen3Config::from_dir(&args.target).with_context(|| {
        format!(
            "--target {}: give a Hugging Face Qwen3, Llama or Qwen2 directory",
            args.target.display()
        )
    })?;
    let prompts = read_prompts(&args.data, &args.target, cfg.vocab_size)?;
    let eos = eos_ids(&args.target)?;
    if eos.is_empty() {
        eprintln!(
            "dflash-top: note: {} has no eos_token_id in config.json or generation_config.json: \
             every continuation runs to --max-new-tokens",
            args.target.display()
        );
    }
    // The output file is opened before the model loads: an unwritable --out fails at once.
    let mut out = PendingFile::create(&args.out)?;
    let (_vs, model) = load_target(args, &cfg, device)?;
    crate::engine::model::decode::set_threads_for(device, &cfg);
    tch::manual_seed(args.seed as i64);
    crate::signals::install();
    let started = Instant::now();
    let decoder = Decoder {
        model: &model,
        eos: &eos,
        device,
        batch: args.batch,
        how: Decoding {
            temperature: args.temperature,
            max_new_tokens: args.max_new_tokens,
        },
    };
    let Some((tokens, stopped_by_eos)) = decoder.write_all(&prompts, &mut out)? else {
        drop(out);
        eprintln!(
            "dflash-top: stopped by a signal; nothing was written to {}",
            args.out.display()
        );
        return Ok(ExitCode::from(crate::signals::FORCED_EXIT as u8));
    };
    out.finish()?;
    let secs = started.elapsed().as_secs_f64();
    crate::signals::outln!(
        "wrote {}: {} sequences, {} new tokens ({} ended at an end token), {:.0} tok/s",
        args.out.display(),
        prompts.len(),
        tokens,
        stopped_by_eos,
        tokens as f64 / secs.max(1e-9)
    );
    Ok(ExitCode::SUCCESS)
}

/// The arguments checked, and the one device they name.
fn checked_device(args: &GenerateArgs) -> Result<tch::Device> {
    if !(args.temperature.is_finite() && args.temperature >= 0.0) {
        bail!(
            "--temperature {} is not a number >= 0: use 0 for greedy or e.g. 0.7",
            args.temperature
        );
    }
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if !(1..=4096).contains(&args.batch) {
        bail!(
            "--batch {} is out of range: give 1 to 4096 prompts decoded together",
            args.batch
        );
    }
    let device = crate::config::parse_devices(&args.device, "--device")?;
    let [device] = device[..] else {
        bail!("--device takes one device, e.g. cpu or cuda:0");
    };
    Ok(device)
}

/// The target with its weights from --target, frozen (bf16 on a GPU).
fn load_target(
    args: &GenerateArgs,
    cfg: &Qwen3Config,
    device: tch::Device,
) -> Result<(VarStore, Qwen3Target)> {
    let loading = crate::progress::Ticker::new();
    let mut vs = VarStore::new(device);
    let model = Qwen3Target::new_full(&vs.root(), cfg, 0.02);
    let weights = crate::engine::model::weights::WeightFiles::open(&args.target)?;
    crate::engine::model::weights::copy_into(
        &vs,
        &weights,
        &crate::engine::model::weights::weights_label(&args.target),
    )?;
    weights.report_done();
    vs.freeze();
    if device.is_cuda() {
        vs.set_kind(Kind::BFloat16);
    }
    if loading.took_long() {
        eprintln!(
            "generate: loaded {} in {:.1}s",
            args.target.display(),
            loading.seconds()
        );
    }
    Ok((vs, model))
}

/// The target decoding prompts `batch` at a time.
struct Decoder<'a> {
    model: &'a Qwen3Target,
    eos: &'a [i64],
    device: tch::Device,
    batch: usize,
    how: Decoding,
}

impl Decoder<'_> {
    /// Every prompt's continuation written to `out`, with progress on stderr. Returns the new
    /// tokens and how many continuations ended at an end token; `None` when a signal stopped it.
    fn write_all(
        &self,
        prompts: &[Vec<i64>],
        out: &mut PendingFile,
    ) -> Result<Option<(u64, usize)>> {
        let mut progress = Progress::new(prompts.len());
        let mut stopped_by_eos = 0;
        for (k, chunk) in prompts.chunks(self.batch).enumerate() {
            let rows: Vec<&[i64]> = chunk.iter().map(Vec::as_slice).collect();
            let done_before = k * self.batch;
            let mut stop = |made: usize| {
                progress.tick(done_before, made);
                crate::signals::requested()
            };
            let (model, eos) = (self.model, self.eos);
            let Some(news) = continuations(model, &rows, eos, self.how, self.device, &mut stop)
            else {
                return Ok(None);
            };
            for (prompt, new) in chunk.iter().zip(&news) {
                stopped_by_eos += new.last().is_some_and(|t| eos.contains(t)) as usize;
                progress.done(new.len());
                out.line(&sample_line(prompt, new))?;
            }
        }
        Ok(Some((progress.tokens, stopped_by_eos)))
    }
}

/// One output line: the prompt (no loss) and the continuation (loss).
fn sample_line(prompt: &[i64], new: &[i64]) -> String {
    let ids: Vec<i64> = prompt.iter().chain(new).copied().collect();
    let mask: Vec<u8> = std::iter::repeat_n(0, prompt.len())
        .chain(std::iter::repeat_n(1, new.len()))
        .collect();
    serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string()
}

/// The prompts of a JSONL file as token ids: each line `input_ids`, `text`, or chat `messages`
/// (through the target's chat template with its generation prompt; a last assistant turn is left
/// out, so that the target writes its own).
pub fn read_prompts(path: &Path, target: &Path, vocab: i64) -> Result<Vec<Vec<i64>>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot read {}: check --data", path.display()))?;
    let mut tok: Option<TextTokenizer> = None;
    let mut prompts = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let at = || format!("{} line {}", path.display(), n + 1);
        let line = line.with_context(at)?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{}: not valid JSON", at()))?;
        let ids = if let Some(ids) = v.get("input_ids") {
            ids.as_array()
                .and_then(|a| a.iter().map(|x| x.as_i64()).collect::<Option<Vec<_>>>())
                .with_context(|| format!("{}: `input_ids` must be a list of integers", at()))?
        } else if v.get("text").is_some() || v.get("messages").is_some() {
            if tok.is_none() {
                let p = target.join("tokenizer.json");
                if !p.is_file() {
                    bail!(
                        "{}: text and chat prompts need {}: add the target's tokenizer, or give \
                         `input_ids`",
                        at(),
                        p.display()
                    );
                }
                tok = Some(TextTokenizer::open(&p)?);
            }
            let t = tok.as_ref().expect("opened above");
            match (v.get("text"), v.get("messages")) {
                (Some(serde_json::Value::String(s)), _) => t.encode(s),
                (None, Some(serde_json::Value::Array(m))) => chat_prompt(t, m),
                _ => Err(anyhow::anyhow!(
                    "`text` must be a string and `messages` a list"
                )),
            }
            .with_context(at)?
        } else {
            bail!(
                "{}: no `input_ids`, `text` or `messages`: each line needs one",
                at()
            );
        };
        if ids.is_empty() {
            bail!("{}: the prompt is empty", at());
        }
        if let Some(bad) = ids.iter().find(|&&i| !(0..vocab).contains(&i)) {
            bail!(
                "{}: token id {bad} is outside the target's vocabulary (0..{vocab})",
                at()
            );
        }
        prompts.push(ids);
    }
    if prompts.is_empty() {
        bail!(
            "{} holds no prompt: give --data a JSONL file with one prompt a line",
            path.display()
        );
    }
    Ok(prompts)
}

/// A chat prompt: the messages (a last assistant turn left out) and the start of the assistant's
/// turn, through the tokenizer's chat template as training renders chat (a tokenizer without one
/// refuses chat prompts).
fn chat_prompt(t: &TextTokenizer, messages: &[serde_json::Value]) -> Result<Vec<i64>> {
    let role = |m: &serde_json::Value| m.get("role").and_then(|r| r.as_str()).map(str::to_string);
    let keep = match messages.last() {
        Some(m) if role(m).as_deref() == Some("assistant") => &messages[..messages.len() - 1],
        _ => messages,
    };
    if keep.is_empty() {
        bail!("`messages` holds no turn before the assistant's");
    }
    t.encode(&t.chat_template()?.render_prompt(keep)?)
}

/// End-of-sequence ids: `eos_token_id` (a number or a list) of config.json and of
/// generation_config.json, together.
pub fn eos_ids(dir: &Path) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for name in ["config.json", "generation_config.json"] {
        let path = dir.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", path.display()))?;
        match v.get("eos_token_id") {
            Some(serde_json::Value::Number(n)) => out.extend(n.as_i64()),
            Some(serde_json::Value::Array(a)) => out.extend(a.iter().filter_map(|x| x.as_i64())),
            _ => {}
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// The output written to `FILE.tmp` and renamed to `FILE` when complete: a failed or stopped
/// run leaves no half-written file (the temporary one is removed on drop).
struct PendingFile {
    tmp: PathBuf,
    out: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl PendingFile {
    fn create(out: &Path) -> Result<PendingFile> {
        let mut name = out.file_name().unwrap_or_default().to_os_string();
        name.push(".tmp");
        let tmp = out.with_file_name(name);
        let file = std::fs::File::create(&tmp).with_context(|| {
            format!(
                "cannot write {}: check --out (its directory must exist and be writable)",
                out.display()
            )
        })?;
        Ok(PendingFile {
            tmp,
            out: out.to_path_buf(),
            file: Some(std::io::BufWriter::new(file)),
        })
    }

    fn line(&mut self, line: &str) -> Result<()> {
        let f = self.file.as_mut().expect("open until finish");
        writeln!(f, "{line}").with_context(|| format!("writing {}", self.tmp.display()))
    }

    fn finish(mut self) -> Result<()> {
        let f = self.file.take().expect("open until finish");
        let written = f
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .and_then(|_| std::fs::rename(&self.tmp, &self.out));
        if written.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        written.with_context(|| format!("cannot write {}", self.out.display()))
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Tokens so far, and a progress line on stderr at most once a second.
struct Progress {
    prompts: usize,
    tokens: u64,
    ticker: crate::progress::Ticker,
}

impl Progress {
    fn new(prompts: usize) -> Progress {
        Progress {
            prompts,
            tokens: 0,
            ticker: crate::progress::Ticker::new(),
        }
    }

    /// `made` new tokens so far in the batch that follows the first `done` prompts.
    fn tick(&mut self, done: usize, made: usize) {
        let tokens = self.tokens + made as u64;
        let prompts = self.prompts;
        self.ticker.tick(|secs| {
            // The prompts done so far at the time they took: what the rest will take.
            let eta = match done {
                0 => "–".to_string(),
                d => format!("{:.0}s", secs / d as f64 * (prompts - d) as f64),
            };
            format!(
                "generate: prompts {done}/{prompts} done, {tokens} new tokens, {:.0} tok/s, \
                 ETA {eta}",
                tokens as f64 / secs.max(1e-9)
            )
        });
    }

    fn done(&mut self, made: usize) {
        self.tokens += made as u64;
    }
}
