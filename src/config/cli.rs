//! The command line: the contract users and later work rely on (grow it, do not rename it).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "dflash-top",
    version,
    about = "Train a DFlash drafter on libtorch and watch every thread of the pipeline live",
    long_about = "Train a DFlash speculative-decoding drafter on libtorch and watch, live in the \
terminal, where every thread of the training pipeline spends its time.\n\nWith no subcommand: \
`train` with the TUI, preset `tiny`, on the CPU, on synthetic data."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Train a drafter (the TUI by default, --headless for log lines).
    // Negative numbers are values, so that `--steps -1` is refused naming --steps.
    #[command(allow_negative_numbers = true)]
    Train(TrainArgs),
    /// Join a running session (ours or a Python pipeline's) in the TUI, or list them.
    Attach(AttachArgs),
    /// Show a recorded run (--record FILE) in the TUI.
    Replay {
        /// A file written by `train --record`.
        file: PathBuf,
    },
    /// Write a Chrome trace (opens in Perfetto) from a recorded run.
    Export {
        /// A file written by `train --record`.
        file: PathBuf,
        /// Where to write the Chrome-trace JSON.
        #[arg(long, value_name = "OUT.json")]
        chrome: PathBuf,
        /// Only the last N seconds of the recording.
        #[arg(long, value_name = "N")]
        seconds: Option<f64>,
    },
    /// Measure the engine: training steps/s and tok/s for a preset.
    Bench(BenchArgs),
    /// Check libtorch, CUDA, NVML and per-thread CPU on this machine.
    Doctor,
    /// Write the target's own continuations of prompts as training data (input_ids + loss_mask).
    Generate(GenerateArgs),
}

#[derive(Args, Debug, Clone)]
pub struct GenerateArgs {
    /// A Hugging Face Qwen3, Llama or Qwen2 directory (config.json + safetensors; tokenizer.json
    /// for text and chat prompts).
    #[arg(long, value_name = "DIR")]
    pub target: PathBuf,
    /// Prompts, one JSON object a line: `input_ids`, `text`, or chat `messages` (rendered with
    /// the target's chat template; a last assistant turn is left out and written anew).
    #[arg(long, value_name = "PROMPTS.jsonl")]
    pub data: PathBuf,
    /// Where to write the JSONL (`input_ids` + `loss_mask`: 0 on the prompt, 1 on the reply).
    #[arg(long, value_name = "FILE.jsonl")]
    pub out: PathBuf,
    /// New tokens per prompt at most (fewer when the target writes an end token).
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub max_new_tokens: usize,
    /// 0 for greedy; above 0, sampled from softmax(logits / T).
    #[arg(long, value_name = "T", default_value_t = 0.0)]
    pub temperature: f64,
    /// Seed of the sampler (with --temperature above 0).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
    /// Where the target runs: cpu or cuda:N (bf16 on CUDA).
    #[arg(long, value_name = "cpu|cuda:N", default_value = "cpu")]
    pub device: String,
    /// Prompts decoded together (padded on the left; a finished row leaves the batch). Greedy
    /// output is the same for any batch.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub batch: usize,
}

#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// Print one line per interval instead of the TUI.
    #[arg(long)]
    pub headless: bool,
    /// Model shapes with random weights when no --target is given.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// A Hugging Face Qwen3, Llama or Qwen2 directory (config.json + safetensors) for the target.
    #[arg(long, value_name = "DIR")]
    pub target: Option<PathBuf>,
    /// A DFlash drafter directory to start from (released or saved).
    #[arg(long, value_name = "DIR")]
    pub drafter: Option<PathBuf>,
    /// `synthetic` or a JSONL file (input_ids, or text/chat with the target's tokenizer).
    #[arg(long, value_name = "synthetic|PATH")]
    pub data: Option<String>,
    /// Stop after this many drafter steps (default: run until quit).
    #[arg(long, value_name = "N")]
    pub steps: Option<u64>,
    /// Where checkpoints go.
    #[arg(long, value_name = "DIR")]
    pub save_dir: Option<PathBuf>,
    /// Save a checkpoint every N drafter steps.
    #[arg(long, value_name = "N")]
    pub save_every: Option<u64>,
    /// Keep only the newest N `step-*` checkpoints in --save-dir (default: keep all).
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Stop the run after this many steps in a row with a non-finite loss or gradient
    /// (default 20; such steps are skipped and counted).
    #[arg(long, value_name = "K")]
    pub max_nonfinite: Option<u32>,
    /// Threads that read and tokenize a JSONL data file ahead of the loader (0: the loader reads
    /// each line itself; default one per 8 cores, 1 to 4).
    #[arg(long, value_name = "N")]
    pub data_threads: Option<usize>,
    /// Turn fast paths off for a side-by-side run, comma-separated: graphs, drafter-graph,
    /// target-kernels, fused-adamw, bf16-weights, flash-target, block-attention,
    /// drafter-kernels, gemm-grads, grad-sync-during-backward, single-replica-shortcut.
    #[arg(long, value_name = "LIST")]
    pub disable: Option<String>,
    /// How the frozen target's linear layers compute: `bf16` (the default) or `fp8` (weights
    /// e4m3 per channel, inputs per token, on FP8 tensor cores: compute capability 8.9 and up;
    /// half the target's weight memory; the CPU emulates it, for its numbers, not for speed).
    #[arg(long, value_name = "bf16|fp8")]
    pub target_precision: Option<String>,
    /// How the drafter's AdamW keeps its two moments: `f32` (the default) or `bf16` (rounded
    /// stochastically; 4 bytes a drafter parameter less: 9.6 GiB at qwen3-32b's drafter).
    #[arg(long, value_name = "f32|bf16")]
    pub optimizer_states: Option<String>,
    /// Continue a run from a checkpoint directory.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Let a new run save into a --save-dir that holds another run's checkpoints, replacing
    /// those of the same steps (without it such a directory is refused).
    #[arg(long)]
    pub overwrite: bool,
    /// Devices of the target workers, e.g. `cpu` or `cuda:0,cuda:1`; `all` (with
    /// --drafter-devices all or left out) splits every GPU between targets and drafters by the
    /// placement advice; with the drafters' devices listed, targets go on every GPU.
    #[arg(long, value_name = "LIST")]
    pub target_devices: Option<String>,
    /// Devices of the drafter workers, e.g. `cpu` or `cuda:2,cuda:3`, or `all`.
    #[arg(long, value_name = "LIST")]
    pub drafter_devices: Option<String>,
    /// Viewers (`dflash-top attach`) the run's socket serves at once (default 16, at most 256;
    /// 0 refuses every viewer).
    #[arg(long, value_name = "N")]
    pub max_viewers: Option<usize>,
    /// Record the telemetry stream (gzip) to this file, for `replay` and `export`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// A TOML run configuration; flags override it.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Random seed.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Slow a stage on purpose to see starvation, e.g. `target=20ms` or `drafter=50ms`.
    #[arg(long, value_name = "STAGE=DURATION")]
    pub slow: Vec<String>,
    /// GPU timing mode at start: `events` (device time from CUDA events; the default on CUDA),
    /// `async` (host wall time) or `sync` (synchronize the worker's stream per phase).
    #[arg(long, value_name = "events|async|sync")]
    pub gpu_timing: Option<String>,
    /// Count each CUDA worker's kernel launches and its CPU time in launch and sync calls with
    /// CUPTI (libcupti, from the nvidia-cuda-cupti wheel): `auto` (the default) where a worker
    /// is on CUDA and the library loads, `on` (an error where it cannot), or `off`.
    #[arg(long, value_name = "auto|on|off")]
    pub cupti: Option<String>,
    /// Record phase times from the start (`on`, the default) or not (`off`); `p` flips it.
    #[arg(long, value_name = "on|off")]
    pub profiling: Option<String>,
    /// Seconds between headless lines.
    #[arg(long, value_name = "SECONDS")]
    pub interval: Option<f64>,
    /// Packed rows per batch (recipe: the preset's, or 1 with --target).
    #[arg(long, value_name = "N")]
    pub batch: Option<i64>,
    /// Tokens per packed row, 32 to 65536 (recipe: the preset's, or 3072 with --target).
    #[arg(long, value_name = "N")]
    pub seq_len: Option<i64>,
    /// Anchors (blocks) drawn per document or per packed row, as --anchor-budget says (recipe:
    /// the preset's, or 512 with --target).
    #[arg(long, value_name = "N")]
    pub anchors: Option<i64>,
    /// Whether --anchors is a budget for each packed row (`per-row`, a preset's default: the
    /// same drafter work a row) or for each document (`per-doc`, SpecForge's, and --target's
    /// with one drafter replica).
    #[arg(long, value_name = "per-doc|per-row")]
    pub anchor_budget: Option<String>,
    /// Optimizer steps each packed batch trains, each on its share of the batch's anchors, the
    /// target's hidden states computed once (recipe: the preset's; a resumed run keeps its
    /// own); `doc`: a step for each document, on its anchors (--target's, with one drafter
    /// replica; 6 with several).
    #[arg(long, value_name = "N|doc",
          value_parser = crate::engine::train::recipe::parse_steps_per_batch)]
    pub steps_per_batch: Option<i64>,
    /// Peak learning rate (recipe: the preset's, or 6e-4 with --target).
    #[arg(long, value_name = "LR")]
    pub lr: Option<f64>,
    /// Decoder layers of a fresh drafter (recipe: the preset's, or 5 with --target).
    #[arg(long, value_name = "N")]
    pub drafter_layers: Option<i64>,
    /// Block size of a fresh drafter (16).
    #[arg(long, value_name = "N")]
    pub block_size: Option<i64>,
    /// The mask token id (default: the target tokenizer's, as SpecForge finds it).
    #[arg(long, value_name = "ID")]
    pub mask_token_id: Option<i64>,
    /// With --headless, a CI gate: stop (saving as on a normal stop) and exit with status 3 when
    /// EXPR holds: `tok/s<12000 after 60s`, `verdict=stalled for 30s`, `gpu_idle>20% after 60s`,
    /// `warn>=error` (repeatable).
    #[arg(long = "fail-if", value_name = "EXPR")]
    pub fail_if: Vec<String>,
    /// Where the flight recorder writes the last minute (a recording `replay` opens, and its
    /// Chrome trace) when something goes wrong (default: --save-dir/flight; `off`: never).
    #[arg(long, value_name = "DIR|off")]
    pub flight: Option<PathBuf>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct AttachArgs {
    /// Sessions' PIDs or socket paths (several: one merged view, threads named by rank or PID;
    /// a socket forwarded from another host with `ssh -L` joins like a local one); with none,
    /// the only running session (or the list).
    pub targets: Vec<String>,
    /// Join every local rank of job ID (the sessions carry their job); with no ID, the one job
    /// running here.
    #[arg(long, value_name = "ID", num_args = 0..=1, default_missing_value = "")]
    pub job: Option<String>,
    /// List the running sessions and exit.
    #[arg(long)]
    pub list: bool,
    /// Print one line per interval instead of the TUI.
    #[arg(long)]
    pub headless: bool,
    /// Seconds between headless lines.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Detach after this many seconds (the watched run goes on).
    #[arg(long, value_name = "SECONDS")]
    pub seconds: Option<f64>,
    /// With --headless, a CI gate: detach and exit with status 3 when EXPR holds (the forms of
    /// `train --fail-if`; repeatable).
    #[arg(long = "fail-if", value_name = "EXPR")]
    pub fail_if: Vec<String>,
    /// Keep the last minute in memory and write it here when something goes wrong (as `train
    /// --flight`; default: none).
    #[arg(long, value_name = "DIR")]
    pub flight: Option<PathBuf>,
    /// Record the view (merged, for several sessions) to FILE, a snapshot every --interval
    /// seconds, for `replay` and `export`.
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// A TOML run configuration whose `[warnings]` table sets this viewer's warning rules (the
    /// rest of the file is the run's business and is only checked).
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
}

/// What `bench` measures, by the name its first argument gives.
pub const BENCHES: [&str; 8] = [
    "engine",
    "drafter",
    "modes",
    "profiling",
    "replicas",
    "generate",
    "precision",
    "telemetry",
];

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// What to measure: `engine` (training step), `drafter` (the drafter alone on hidden states
    /// its target computed first: each phase's time and TFLOP/s-equivalent), `modes` (async /
    /// events / sync side by side), `profiling` (profiling on vs off side by side), `telemetry`
    /// (phase-mark cost),
    /// `replicas` (drafter replicas against one drafter with their rows: equal weights, same loss),
    /// `generate` (the preset's target decoding at each of --gen-batches, side by side) or
    /// `precision` (the target in FP8 against bf16: each captured layer's error, on --steps
    /// batches).
    #[arg(default_value = "engine")]
    pub what: String,
    /// `modes` and `profiling`: seconds each setting runs before the next takes over.
    #[arg(long, value_name = "SECONDS", default_value_t = 8.0)]
    pub segment: f64,
    /// `modes` and `profiling`: how many times the settings take turns (after one warm-up turn).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub rounds: u32,
    /// `replicas`: the largest relative gap allowed between the replicas' mean loss and the loss
    /// of one drafter taking every replica's rows.
    #[arg(long, value_name = "FRACTION", default_value_t = 0.02)]
    pub tolerance: f64,
    /// `generate`: the batches decoded, side by side (each one batch of random prompts).
    #[arg(long, value_name = "LIST", default_value = "1,16")]
    pub gen_batches: String,
    /// `generate`: prompt tokens and new tokens per row.
    #[arg(long, value_name = "PROMPT,NEW", default_value = "256,64")]
    pub gen_lengths: String,
    /// `engine` or `drafter` on CUDA: device time by kernel class (GEMM, attention, loss,
    /// norm/RoPE, optimizer, reductions, element-wise, copies) a step, from libtorch's profiler:
    /// engine's over the run's last two thirds, drafter's over its timed steps (turns --cupti
    /// off: CUPTI takes one subscriber). The heaviest N kernels are listed by name (12 when N
    /// is left out).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "12",
          value_parser = parse_kernel_count)]
    pub kernels: Option<usize>,
    #[command(flatten)]
    pub train: TrainArgs,
}

/// `--kernels`' count of kernels to list. A bench's name in its place was written after the flag
/// (`bench --kernels engine`), which took it: the sentence says where it goes.
fn parse_kernel_count(text: &str) -> Result<usize, String> {
    text.parse::<usize>().map_err(|_| {
        let hint = if BENCHES.contains(&text) {
            format!("; the bench's name goes before the flag (`bench {text} --kernels`)")
        } else {
            String::new()
        };
        format!(
            "`{text}` is not a count: --kernels takes how many kernels to list, or nothing{hint}"
        )
    })
}
