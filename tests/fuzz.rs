//! Every parser of user input, fuzzed: arbitrary and near-valid inputs end in `Ok` or an error
//! sentence, never a panic. 64 cases per parser by default (a few seconds in all); a long run:
//! `PROPTEST_CASES=20000 cargo test --test all fuzz` (see the README).

use dflash_top::config::cli::TrainArgs;
use dflash_top::config::{parse_devices, parse_slow, RunConfig};
use dflash_top::engine::checkpoint::read_drafter_spec;
use dflash_top::engine::data::jsonl::JsonlOptions;
use dflash_top::engine::data::jsonl::JsonlSource;
use dflash_top::engine::data::DocSource;
use dflash_top::engine::model::shapes::Qwen3Config;
use dflash_top::engine::model::weights::WeightFiles;
use dflash_top::engine::spec::MAX_SEQ_LEN;
use dflash_top::engine::train::optim::AdamW;
use dflash_top::telemetry::snapshot_lines::read_recording;
use proptest::prelude::*;
use std::path::Path;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An error must be a sentence: non-empty, one that names what it is about.
fn sentence(e: anyhow::Error) {
    let msg = format!("{e:#}");
    assert!(!msg.trim().is_empty());
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A JSON scalar or small array, as text: the values near-valid inputs are made of.
fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (-4i64..5000).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| format!("{v:?}")),
        "[a-z_:,0-9 ]{0,12}".prop_map(|s| format!("{s:?}")),
        Just("true".to_string()),
        Just("null".to_string()),
        prop::collection::vec(-3i64..300, 0..6).prop_map(|v| format!("{v:?}")),
    ]
}

const CONFIG_KEYS: &[&str] = &[
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "vocab_size",
    "tie_word_embeddings",
    "layer_types",
    "sliding_window",
    "num_target_layers",
    "block_size",
    "dflash_config",
    "target_layer_ids",
    "mask_token_id",
    "rope_parameters",
];

/// A JSON object over the config.json keys, with arbitrary values.
fn config_json() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(CONFIG_KEYS), json_value()), 0..18).prop_map(|kv| {
        let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        format!("{{{}}}", body.join(", "))
    })
}

const TOML_KEYS: &[&str] = &[
    "preset",
    "data",
    "steps",
    "save_every",
    "target_devices",
    "drafter_devices",
    "seed",
    "batch",
    "seq_len",
    "anchors",
    "lr",
    "batch_queue",
    "hs_queue",
    "threads_per_worker",
    "slow",
    "interval",
    "gpu_timing",
    "profiling",
    "loss_chunk_mib",
    "keep",
    "max_nonfinite",
    "anchor_budget",
    "max_viewers",
    "verdict_dwell",
    "data_threads",
    "typo_key",
];

fn toml_text() -> impl Strategy<Value = String> {
    prop::collection::vec((prop::sample::select(TOML_KEYS), json_value()), 0..10).prop_map(|kv| {
        kv.iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect::<String>()
    })
}

/// A safetensors file: an 8-byte header length (right or not), a JSON header, data bytes.
fn safetensors_bytes() -> impl Strategy<Value = Vec<u8>> {
    let entry = (
        "[a-z.]{1,8}",
        prop::sample::select(&["F32", "F16", "BF16", "I64", "U8", "BOOL", "X9"][..]),
        prop::collection::vec(0usize..5, 0..3),
        (0usize..64, 0usize..64),
    );
    (
        prop::collection::vec(entry, 0..4),
        prop::collection::vec(any::<u8>(), 0..96),
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(entries, data, right_len, len)| {
            let body: Vec<String> = entries
                .iter()
                .map(|(n, d, shape, (a, b))| {
                    format!(r#""{n}": {{"dtype": "{d}", "shape": {shape:?}, "data_offsets": [{a}, {b}]}}"#)
                })
                .collect();
            let header = format!("{{{}}}", body.join(", ")).into_bytes();
            let n = if right_len { header.len() as u64 } else { len };
            let mut out = n.to_le_bytes().to_vec();
            out.extend(header);
            out.extend(data);
            out
        })
}

fn jsonl_line() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,40}",
        (
            prop::collection::vec(json_value(), 0..8),
            prop::option::of(prop::collection::vec(json_value(), 0..8))
        )
            .prop_map(|(ids, mask)| {
                let ids = format!("[{}]", ids.join(","));
                match mask {
                    Some(m) => format!(r#"{{"input_ids": {ids}, "loss_mask": [{}]}}"#, m.join(",")),
                    None => format!(r#"{{"input_ids": {ids}}}"#),
                }
            }),
        prop::collection::vec(-2i64..200, 0..40)
            .prop_map(|ids| format!(r#"{{"input_ids": {ids:?}}}"#)),
        json_value().prop_map(|v| format!(r#"{{"text": {v}}}"#)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_toml_run_config(text in prop_oneof![toml_text(), ".{0,80}"]) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "run.toml", text.as_bytes());
        let args = TrainArgs { config: Some(path), ..Default::default() };
        match RunConfig::from_args(&args) {
            Err(e) => {
                let msg = format!("{e:#}");
                prop_assert!(msg.contains("run.toml") || msg.contains('`') || msg.contains("--"), "{msg}");
            }
            // What is accepted is in range: the engine uses it as it is.
            Ok(c) => {
                let c = c.pipeline;
                prop_assert!(c.threads_per_worker.is_none_or(|n| (1..=256).contains(&n)));
                prop_assert!((1..=512).contains(&c.anchors) && (32..=MAX_SEQ_LEN).contains(&c.seq_len));
                prop_assert!(c.batch >= 1 && c.batch_queue >= 1 && c.hs_queue >= 1);
                prop_assert!(c.data_threads.is_none_or(|n| n <= 64));
            }
        }
    }

    #[test]
    fn fuzz_verdict_dwell(v in prop_oneof![-5.0f64..700.0, Just(f64::NAN)]) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "run.toml", format!("verdict_dwell = {v:?}\n").replace("NaN", "nan").as_bytes());
        let args = TrainArgs { config: Some(path), ..Default::default() };
        match RunConfig::from_args(&args) {
            Err(e) => {
                prop_assert!(!(0.0..=600.0).contains(&v), "{v}: {e:#}");
                prop_assert!(format!("{e:#}").contains("`verdict_dwell`"), "{e:#}");
            }
            Ok(c) => prop_assert_eq!(c.viewer.verdict_dwell_ns, (v * 1e9) as u64),
        }
    }

    #[test]
    fn fuzz_trainer_state_on_resume(
        fields in prop::collection::vec(
            (prop::sample::select(&["step", "total_steps", "seed", "lr", "data_docs", "anchor_rng",
                "seq_len", "batch", "anchors", "anchor_scope", "last_loss", "steps_per_batch", "batch_steps_done"][..]), json_value()),
            0..8,
        )
    ) {
        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("step-000001");
        std::fs::create_dir(&ckpt).unwrap();
        let preset = dflash_top::engine::train::presets::Preset::by_name("tiny").unwrap();
        let spec = preset.drafter_spec(&preset.target);
        let cfg = dflash_top::engine::checkpoint::drafter_config_json(&spec);
        write(&ckpt, "config.json", cfg.to_string().as_bytes());
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k:?}: {v}")).collect();
        write(&ckpt, "trainer_state.json", format!("{{{}}}", body.join(", ")).as_bytes());
        let args = TrainArgs { resume: Some(ckpt), steps: Some(10), ..Default::default() };
        match RunConfig::from_args(&args) {
            Err(e) => prop_assert!(format!("{e:#}").contains("trainer_state.json")
                || format!("{e:#}").contains('`') || format!("{e:#}").contains("--"), "{e:#}"),
            Ok(c) => {
                let c = c.pipeline;
                let s = c.resume_state.unwrap();
                // A synthetic stream is re-made up to its position: bounded by the run's length.
                let most = s.step.saturating_add(1).saturating_mul(c.batch as u64)
                    .saturating_mul(c.seq_len as u64).saturating_mul(64);
                prop_assert!(s.data_docs <= most, "{} > {most}", s.data_docs);
                prop_assert!((1..=512).contains(&c.anchors) && (32..=MAX_SEQ_LEN).contains(&c.seq_len));
            }
        }
    }

    #[test]
    fn fuzz_config_json(text in prop_oneof![config_json(), ".{0,60}"]) {
        if let Err(e) = Qwen3Config::from_json(&text) { sentence(e) }
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "config.json", text.as_bytes());
        match read_drafter_spec(dir.path()) {
            Err(e) => prop_assert!(format!("{e:#}").contains("config.json"), "{e:#}"),
            // A drafter read is one the engine can build: its block and target layers in range.
            Ok(spec) => {
                prop_assert!((2..=16).contains(&spec.block_size), "{}", spec.block_size);
                prop_assert!(!spec.target_layer_ids.is_empty() && spec.num_target_layers >= 1);
            }
        }
        if let Err(e) = Qwen3Config::from_dir(dir.path()) {
            prop_assert!(format!("{e:#}").contains("config.json"), "{e:#}");
        }
    }

    #[test]
    fn fuzz_safetensors_headers(
        bytes in prop_oneof![safetensors_bytes(), prop::collection::vec(any::<u8>(), 0..64)]
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "model.safetensors", &bytes);
        match WeightFiles::open(dir.path()) {
            Err(e) => prop_assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}"),
            // A header that passed its checks promises every tensor's bytes.
            Ok(w) => {
                for name in w.names() {
                    prop_assert!(w.read(name).is_ok(), "{name}");
                }
            }
        }
        let mut opt = AdamW::new(vec![("w".into(), tch::Tensor::zeros([2, 2], tch::kind::FLOAT_CPU))]);
        if let Err(e) = opt.load(&path) {
            prop_assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}");
        }
    }

    #[test]
    fn fuzz_jsonl_data_lines(lines in prop::collection::vec(jsonl_line(), 0..6)) {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "data.jsonl", lines.join("\n").as_bytes());
        // Opened and read through twice, by the loader itself and by a reading thread: any
        // error names the file.
        for threads in [0, 1] {
            let opts = JsonlOptions { seed: Some(3), threads, ..JsonlOptions::new(151) };
            let read = JsonlSource::open(&path, opts)
                .and_then(|mut s| (0..2 * lines.len()).try_for_each(|_| s.next_doc().map(drop)));
            if let Err(e) = read {
                prop_assert!(format!("{e:#}").contains("data.jsonl"), "{e:#}");
            }
        }
    }

    #[test]
    fn fuzz_recordings(cut in 0usize..4000, flip in any::<(usize, u8)>(), junk in ".{0,40}") {
        let good = serde_json::to_string(&crate::tui::starved_snapshot()).unwrap();
        let mut bytes = good.clone().into_bytes();
        bytes.truncate(cut.min(bytes.len()));
        if !bytes.is_empty() {
            let i = flip.0 % bytes.len();
            bytes[i] = flip.1;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, content) in [
            ("cut.jsonl", bytes),
            ("junk.jsonl", format!("{good}\n{junk}\n").into_bytes()),
        ] {
            let path = write(dir.path(), name, &content);
            if let Err(e) = read_recording(&path) {
                prop_assert!(format!("{e:#}").contains(name), "{e:#}");
            }
        }
    }

    #[test]
    fn fuzz_slow_and_device_lists(
        items in prop::collection::vec(
            prop_oneof!["(loader|target|drafter|gpu)=[0-9.]{0,6}(ms|us|s|x)?", ".{0,12}"],
            0..4
        ),
        list in prop_oneof!["((cpu|cuda|cuda:[0-9]{1,20}|tpu|),?){0,4}", ".{0,16}"],
    ) {
        if let Err(e) = parse_slow(&items) {
            prop_assert!(format!("{e:#}").contains("--slow"), "{e:#}");
        }
        if let Err(e) = parse_devices(&list, "--drafter-devices") {
            prop_assert!(format!("{e:#}").contains("--drafter-devices"), "{e:#}");
        }
    }
}

mod frames {
    //! Recordings of the frame stream (`train --record`), with numbers in and far out of range:
    //! `read` takes them or refuses them with a sentence naming the file, and what it takes goes
    //! through `export` (spans, trace) and `replay` (mirror, hub windows) without a panic or an
    //! allocation sized by a declared number.

    use super::config;
    use dflash_top::telemetry::assemble::{Assembler, TickInput};
    use dflash_top::telemetry::clock;
    use dflash_top::telemetry::stages::StageTable;
    use dflash_top::telemetry::switches::Timing;
    use dflash_top::telemetry::{GpuTiming, Telemetry};
    use dflash_top::wire::mirror::Mirror;
    use dflash_top::wire::protocol::*;
    use dflash_top::wire::recording::{self, Recording};
    use proptest::prelude::*;
    use std::io::Write;
    use std::path::{Path, PathBuf};

    /// A number that is often at an edge: 0, small, the protocol's bounds and just past them,
    /// the type's maximum.
    fn n64() -> impl Strategy<Value = u64> {
        prop_oneof![
            0u64..1000,
            Just(MAX_SPAN_NS),
            Just(MAX_SPAN_NS + 1),
            Just(MAX_TIME_NS),
            Just(MAX_TIME_NS + 1),
            Just(u64::MAX),
            any::<u64>(),
        ]
    }

    fn id() -> impl Strategy<Value = u32> {
        prop_oneof![
            0u32..4,
            Just(MAX_THREADS - 1),
            Just(MAX_THREADS),
            Just(4_000_000_000),
            Just(u32::MAX),
        ]
    }

    fn count() -> impl Strategy<Value = usize> {
        prop_oneof![0usize..4, Just(MAX_PHASE_ENTRIES + 1), Just(2000)]
    }

    fn phases() -> impl Strategy<Value = Vec<(u16, u64)>> {
        (count(), any::<u16>(), n64()).prop_map(|(n, k, ns)| vec![(k % 12, ns); n])
    }

    fn hello() -> Hello {
        Hello {
            pid: 1,
            program: "dflash-top".into(),
            now_ns: 0,
            ns_per_mark: 5.0,
            stages: StageTable::builtin(),
            can_save: false,
            config: Some("config: recipe=preset:tiny fast_paths=-graphs".into()),
            job: None,
            cupti: None,
            host: None,
        }
    }

    fn msg() -> impl Strategy<Value = Msg> {
        let stage = prop::sample::select(&["loader", "target", "drafter", "nope"][..]);
        prop_oneof![
            (id(), stage).prop_map(|(id, stage)| Msg::Thread(ThreadDecl {
                id,
                name: format!("t{id}"),
                stage: stage.into(),
                device: "cpu".into(),
                tid: 1,
            })),
            (id(), prop_oneof![Just(0usize), Just(4), Just(usize::MAX)]).prop_map(
                |(id, capacity)| Msg::Queue(QueueDecl {
                    id,
                    name: "q".into(),
                    capacity,
                    producer: "target".into(),
                    consumer: "drafter".into(),
                })
            ),
            (id(), n64(), n64(), phases(), n64(), any::<bool>()).prop_map(
                |(th, end, wall, ph, tok, prof)| Msg::Step(WireStep {
                    th,
                    end,
                    wall,
                    ph: ph.clone(),
                    prof,
                    timing: Timing::Host,
                    steps: 1,
                    idle: 0,
                    tok,
                    m: None,
                    n: ph.iter().map(|(k, _)| (*k, 1)).collect(),
                    sy: ph.iter().map(|(k, _)| (*k, 2)).collect(),
                    cu: prof.then_some(dflash_top::telemetry::CudaCalls {
                        launches: tok,
                        launch_ns: wall,
                        sync_ns: end,
                    }),
                })
            ),
            (n64(), id(), n64(), phases(), count(), id(), n64(), n64()).prop_map(
                |(now, th, ss, acc, nq, qid, counter, depth)| Msg::Sample(Sample {
                    now,
                    prof: true,
                    timing: GpuTiming::Async,
                    paused: false,
                    dropped: 0,
                    live: vec![WireLive {
                        th,
                        ph: 0,
                        ps: ss,
                        ss,
                        acc,
                        sites: Vec::new(),
                        steps: 0,
                    }],
                    q: vec![
                        WireQueue {
                            id: qid,
                            at: now,
                            depth: depth as usize,
                            push: counter,
                            pop: counter / 2,
                            push_wait: counter,
                            pop_wait: 0,
                            depth_ns: counter,
                            empty: counter,
                            full: 0,
                            age_sum: counter,
                            min: 0,
                            max: depth as usize,
                        };
                        nq.min(300)
                    ],
                    // Devices past the bound, counts at and past theirs, too many devices.
                    alloc: vec![
                        WireAlloc {
                            cuda: qid % 80,
                            reserved: counter,
                            allocated: counter / 2,
                            segments: depth,
                            allocs: counter,
                            frees: counter / 3,
                            retries: depth,
                            graphs: counter,
                        };
                        nq % 70
                    ],
                    // Past the bounds too: too many GPUs, memory past the counters' bound.
                    gpu: vec![
                        dflash_top::wire::protocol::WireGpu {
                            index: qid,
                            used: counter,
                            total: counter,
                            w: depth as f64,
                            ..Default::default()
                        };
                        nq % 70
                    ],
                })
            ),
            n64().prop_map(|frames| Msg::Dropped { frames }),
        ]
    }

    /// A gzip recording of `msgs` after a hello.
    pub fn write_recording(path: &Path, msgs: &[Msg]) {
        let f = std::fs::File::create(path).unwrap();
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::default());
        write_preamble(&mut gz).unwrap();
        write_msg(&mut gz, &Msg::Hello(hello())).unwrap();
        for m in msgs {
            write_msg(&mut gz, m).unwrap();
        }
        gz.finish().unwrap().flush().unwrap();
    }

    /// What `replay` does with the messages, one hub tick after each sample, synchronously.
    fn replay(msgs: Vec<Msg>) {
        let mut telemetry = Telemetry::new();
        telemetry.probes = false;
        let mut mirror = Mirror::new(&hello(), &telemetry, 0).unwrap();
        let mut asm = Assembler::new(clock::now_ns());
        for m in msgs {
            let tick = matches!(m, Msg::Sample(_));
            mirror.apply(m);
            if tick {
                while let Ok(r) = telemetry.records().try_recv() {
                    asm.ingest(&r);
                }
                let threads = telemetry.registry().threads();
                assert!(threads.len() <= MAX_THREADS as usize);
                let queues = telemetry.queue_probes();
                let now = clock::now_ns();
                let counters: Vec<_> = queues.iter().map(|q| q.read(now)).collect();
                let _ = asm.tick_read(&TickInput {
                    now_ns: now,
                    threads: &threads,
                    queues: &queues,
                    counters: &counters,
                    switches: telemetry.switches(),
                    dropped: telemetry.dropped(),
                    allocator: &[],
                    gpus: &[],
                });
            }
        }
    }

    pub fn tmp_file(dir: &Path, name: &str) -> PathBuf {
        dir.join(name)
    }

    proptest! {
        #![proptest_config(config())]

        #[test]
        fn fuzz_frame_recordings(msgs in prop::collection::vec(msg(), 0..24)) {
            let dir = tempfile::tempdir().unwrap();
            let path = tmp_file(dir.path(), "run.dft");
            write_recording(&path, &msgs);
            let all_in_range = msgs.iter().all(|m| m.check().is_ok());
            match recording::read(&path) {
                Ok(Recording::Frames(read)) => {
                    prop_assert!(all_in_range, "an out-of-range frame was taken");
                    prop_assert_eq!(read.len(), msgs.len() + 1);
                    let (spans, names) = recording::spans(&read).unwrap();
                    let path = dir.path().join("t.json");
                    dflash_top::telemetry::trace::write_trace(&path, &spans, &names).unwrap();
                    replay(read);
                }
                Ok(Recording::Snapshots(_)) => prop_assert!(false, "a frame stream read as snapshots"),
                Err(e) => {
                    let msg = format!("{e:#}");
                    prop_assert!(!all_in_range, "in-range frames refused: {msg}");
                    prop_assert!(msg.contains("run.dft") && msg.contains("beyond"), "{msg}");
                }
            }
            // A live stream is not checked by `read`: the mirror lets out-of-range frames go.
            replay(msgs);
        }
    }

    use crate::support::bin;

    /// Runs the binary to its end; its output and its peak resident memory (KiB), from wait4's
    /// rusage of that child alone.
    // The child is waited for with wait4 (for its rusage), which clippy does not see.
    #[allow(clippy::zombie_processes)]
    fn run_measured(cmd: &mut std::process::Command) -> (std::process::Output, i64) {
        use std::io::Read;
        use std::os::unix::process::ExitStatusExt;
        let mut child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_end(&mut err).unwrap();
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid value; wait4 fills it for the child we spawned.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
        assert_eq!(pid, child.id() as i32);
        let o = std::process::Output {
            status: std::process::ExitStatus::from_raw(status),
            stdout: out,
            stderr: err,
        };
        (o, usage.ru_maxrss)
    }

    fn refused(o: &std::process::Output, mention: &[&str]) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(
            o.status.code(),
            Some(1),
            "a sentence and exit 1, not an abort: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
        for m in mention {
            assert!(err.contains(m), "`{m}` missing: {err}");
        }
    }

    /// Issue 24: a recording declaring thread id 4,000,000,000 aborted `export` and `replay`
    /// (a 128 GB table). Both now refuse it with a sentence naming the file and the id, before
    /// `replay` takes the terminal.
    #[test]
    fn a_recording_declaring_thread_id_four_billion_is_refused_by_export_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("huge-id.dft");
        let decl = ThreadDecl {
            id: 4_000_000_000,
            name: "x".into(),
            stage: "drafter".into(),
            device: "cpu".into(),
            tid: 1,
        };
        write_recording(&path, &[Msg::Thread(decl)]);
        let out = dir.path().join("t.json");
        let o = bin()
            .args(["export"])
            .arg(&path)
            .arg("--chrome")
            .arg(&out)
            .output()
            .unwrap();
        refused(
            &o,
            &["huge-id.dft", "thread id 4000000000", "train --record"],
        );
        assert!(!out.exists());
        let o = bin().arg("replay").arg(&path).output().unwrap();
        refused(&o, &["huge-id.dft", "thread id 4000000000"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("\x1b[?1049h"),
            "replay took the screen before reading: {err}"
        );
    }

    /// Issue 24: a 50 KB crafted recording cost ~240 MB in `export`. A file that expands far
    /// beyond what a recording does is refused, and reading it costs little memory: no more
    /// than exporting a small real-shaped recording, give or take 64 MiB.
    #[test]
    fn a_small_crafted_recording_costs_little_memory_in_export() {
        let dir = tempfile::tempdir().unwrap();
        let step = |th: u32| {
            Msg::Step(WireStep {
                th,
                end: 1000,
                wall: 10,
                ph: vec![(3, 1); MAX_PHASE_ENTRIES],
                prof: true,
                timing: Timing::Host,
                steps: 1,
                idle: 0,
                tok: 0,
                m: None,
                n: Vec::new(),
                sy: Vec::new(),
                cu: None,
            })
        };
        let decl = Msg::Thread(ThreadDecl {
            id: 0,
            name: "drafter-0".into(),
            stage: "drafter".into(),
            device: "cpu".into(),
            tid: 1,
        });
        let bomb = dir.path().join("bomb.dft");
        let mut msgs = vec![decl.clone()];
        msgs.extend(std::iter::repeat_n(step(0), 100_000));
        write_recording(&bomb, &msgs);
        let size = std::fs::metadata(&bomb).unwrap().len();
        assert!(size < 256_000, "the crafted file is small: {size} bytes");
        let small = dir.path().join("small.dft");
        write_recording(&small, &[decl, step(0), step(0)]);
        let export = |file: &Path| {
            run_measured(
                bin()
                    .arg("export")
                    .arg(file)
                    .arg("--chrome")
                    .arg(dir.path().join("t.json")),
            )
        };
        let (ok, base_kib) = export(&small);
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        let (o, bomb_kib) = export(&bomb);
        refused(&o, &["bomb.dft", "expands to more than"]);
        assert!(
            bomb_kib < base_kib + 64 * 1024,
            "the crafted file cost {} MiB against {} MiB for a small recording",
            bomb_kib / 1024,
            base_kib / 1024
        );
    }
}
