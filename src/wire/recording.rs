//! Recordings: the same frame stream a viewer gets (preamble, hello, declarations, steps,
//! samples), gzip-compressed into a file. `replay` feeds it to a local hub at its recorded pace;
//! `export` reads its steps. Files of the older format (one JSON snapshot a line) still read.

use super::fanout::{drain, pump, Fanout, Outlet, OutletRx};
use super::protocol::*;
use crate::telemetry::names::Names;
use crate::telemetry::snapshot::{Snapshot, StepSpan};
use crate::telemetry::stages::TableError;
use crate::telemetry::{Phase, Telemetry};
use anyhow::{bail, Context, Result};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Data frames the recorder may fall behind by (a stalled disk) before it loses any.
const RECORDER_BACKLOG: usize = 200_000;
/// A recording keeps every step and one sample in this many (2 a second): queue counters are
/// cumulative, so nothing is lost but resolution, and samples are most of a stream's bytes.
const RECORD_SAMPLE_EVERY: u64 = 5;

/// A decompressed recording may hold this many times its file's bytes (dflash-top's own
/// recordings: about 4x) ...
const MAX_EXPANSION: u64 = 100;
/// ... or this many bytes, whichever is more: a small crafted file cannot cost much memory.
const MIN_BUDGET: u64 = 4 << 20;

/// A recording being written.
pub struct Recorder {
    outlet: Arc<Outlet>,
    handle: JoinHandle<Result<()>>,
}

/// The sentence for a recording that could not be written: the flag, the file, what the
/// system said, that training goes on, and the fix that fits.
pub fn write_failure(path: &Path, e: &std::io::Error) -> String {
    let fix = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => "free space on its disk or record elsewhere",
        Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
            "record to a writable directory"
        }
        _ => "record to another file",
    };
    format!(
        "--record {}: writing failed ({e}); the recording stops here and training goes on; {fix}",
        path.display()
    )
}

impl Recorder {
    /// Creates `path` now (a bad path is reported before training starts) and records every
    /// frame of `fanout` into it. A write that fails later stops the recording only: the
    /// failure is raised as an alert of `telemetry` at once (the header and the headless lines
    /// show it) and training goes on.
    pub fn start(fanout: &Fanout, path: &Path, telemetry: &Telemetry) -> Result<Recorder> {
        let file = std::fs::File::create(path).with_context(|| {
            format!(
                "--record {}: cannot create the file; check the directory",
                path.display()
            )
        })?;
        let (outlet, rx) = Outlet::thinned(RECORDER_BACKLOG, RECORD_SAMPLE_EVERY);
        fanout.attach(outlet.clone());
        let path: PathBuf = path.to_path_buf();
        let o = outlet.clone();
        let telemetry = telemetry.clone();
        let handle = std::thread::Builder::new()
            .name("recorder".into())
            .spawn(move || {
                let r = write_all(&o, &rx, file);
                // Nothing more is queued for a file that cannot take it.
                o.closed.store(true, Relaxed);
                r.map_err(|e| {
                    let msg = write_failure(&path, &e);
                    telemetry.alert(msg.clone());
                    anyhow::anyhow!(msg)
                })
            })?;
        Ok(Recorder { outlet, handle })
    }

    /// Writes what is queued and closes the file.
    pub fn finish(self) -> Result<()> {
        self.outlet.closed.store(true, Relaxed);
        match self.handle.join() {
            Ok(r) => r,
            Err(_) => bail!("the recorder thread panicked"),
        }
    }
}

fn write_all(outlet: &Outlet, rx: &OutletRx, file: std::fs::File) -> std::io::Result<()> {
    let mut gz = GzEncoder::new(BufWriter::new(file), flate2::Compression::default());
    write_preamble(&mut gz)?;
    pump(outlet, rx, &mut gz)?;
    drain(rx, &mut gz)?;
    gz.finish()?.flush()?;
    Ok(())
}

/// Bytes a gzip file expands to, counted up to `limit` (a stream cut short: up to the cut).
fn expanded_size(file: std::fs::File, limit: u64) -> u64 {
    let mut r = GzDecoder::new(file).take(limit);
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match r.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Ok(0) | Err(_) => return n,
            Ok(k) => n += k as u64,
        }
    }
}

/// A recording read back.
pub enum Recording {
    /// The frame stream (this version).
    Frames(Vec<Msg>),
    /// One snapshot a line (recordings of earlier versions).
    Snapshots(Vec<Snapshot>),
}

/// Reads a recording of either format. A stream cut short (a killed run) reads up to its last
/// whole frame.
pub fn read(path: &Path) -> Result<Recording> {
    let mut file = std::fs::File::open(path).with_context(|| {
        format!(
            "cannot open {}: give a file written by `train --record`",
            path.display()
        )
    })?;
    let mut head = [0u8; 2];
    let n = file
        .read(&mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if n == 2 && head == [0x1f, 0x8b] {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let budget = size.saturating_mul(MAX_EXPANSION).max(MIN_BUDGET);
        // A first pass counts what the file expands to, holding nothing: one that expands too
        // far costs no memory before it is refused.
        if expanded_size(file, budget + 1) > budget {
            bail!(
                "{} expands to more than {} MiB from {} KiB (over {}x; dflash-top's recordings \
                 expand a few times): a damaged or crafted file, not read",
                path.display(),
                budget >> 20,
                size >> 10,
                MAX_EXPANSION
            );
        }
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut r = BufReader::new(GzDecoder::new(file).take(budget));
        read_preamble(&mut r).with_context(|| format!("{}", path.display()))?;
        let mut msgs = Vec::new();
        loop {
            match read_msg(&mut r) {
                Ok(Some(m)) => {
                    if let Err(why) = m.check() {
                        bail!(
                            "{} is damaged: frame {} has {why}; give a file written by \
                             `train --record`",
                            path.display(),
                            msgs.len() + 1
                        );
                    }
                    msgs.push(m);
                }
                Ok(None) | Err(WireError::Truncated) => break,
                Err(WireError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(e) => return Err(e).with_context(|| format!("{} is damaged", path.display())),
            }
        }

        if !matches!(msgs.first(), Some(Msg::Hello(_))) {
            bail!(
                "{} does not start with a session's hello: give a file written by `train --record`",
                path.display()
            );
        }
        return Ok(Recording::Frames(msgs));
    }
    crate::telemetry::snapshot_lines::read_recording(path).map(Recording::Snapshots)
}

/// The `config:` line the recorded run said in its hello (dflash-top's trainer says one).
pub fn config_line(msgs: &[Msg]) -> Option<&str> {
    msgs.iter().find_map(|m| match m {
        Msg::Hello(h) => h.config.as_deref(),
        _ => None,
    })
}

/// The step spans of a recording, for the Chrome trace (ns from the recording's start), and the
/// names of its pipeline (as its last stage table has them).
pub fn spans(msgs: &[Msg]) -> Result<(Vec<StepSpan>, Names)> {
    let Some(Msg::Hello(hello)) = msgs.first() else {
        bail!("the recording has no hello");
    };
    let mut table = hello.stages.clone();
    let (mut names, mut roles) = match table.resolve() {
        Ok(resolved) => resolved,
        // Zero-code mode's table starts empty and grows.
        Err(TableError::Empty) => (Names::builtin(), Vec::new()),
        Err(e) => bail!("the recording's stage table: {e}"),
    };
    // (name, stage) by thread id; the role is the stage's in the table at the step.
    let mut threads: Vec<Option<(String, String)>> = Vec::new();
    let mut out = Vec::new();
    for m in msgs.iter().skip(1) {
        match m {
            // A producer whose table grows (zero-code mode) declares it again.
            Msg::Hello(h) if h.stages != table => {
                if let Ok((n, r)) = h.stages.resolve() {
                    table = h.stages.clone();
                    names = n;
                    roles = r;
                }
            }
            // Ids beyond the protocol's bound size no table (`read` refuses them already).
            Msg::Thread(t) if t.id < MAX_THREADS => {
                let id = t.id as usize;
                if threads.len() <= id {
                    threads.resize(id + 1, None);
                }
                threads[id] = Some((t.name.clone(), t.stage.clone()));
            }
            Msg::Step(s) if s.prof && s.steps > 0 => {
                let Some(Some((name, stage))) = threads.get(s.th as usize) else {
                    continue;
                };
                let Some(role) = table.role_of(&roles, stage) else {
                    continue;
                };
                let list = names.phases(role);
                let phases =
                    s.ph.iter()
                        .filter_map(|(k, ns)| Some((*list.get(*k as usize)?, *ns)))
                        .filter(|(p, ns)| *p != Phase::Other && *ns > 0)
                        .collect();
                out.push(StepSpan {
                    thread: name.clone(),
                    role,
                    end_ns: s.end.saturating_sub(hello.now_ns),
                    wall_ns: s.wall,
                    phases,
                });
            }
            _ => {}
        }
    }
    Ok((out, names))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda_shim::AllocatorStats;
    use crate::probe::allocator::AllocatorSample;
    use crate::telemetry::assemble::TickInput;
    use crate::telemetry::clock;
    use crate::telemetry::hub::RawTap;
    use crate::telemetry::Role;

    /// Issue 28: the allocator figures a trainer's hub reads go out in its samples (the socket's
    /// and the recording's, which keeps one sample in five) and a replay of the recording shows
    /// them, rated over the recorded samples.
    #[test]
    fn the_allocator_figures_of_recorded_samples_replay() {
        let telemetry = Telemetry::new();
        let fanout = Fanout::tap(&telemetry, false, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.dftop");
        let rec = Recorder::start(&fanout, &path, &telemetry).unwrap();
        let _drafter = telemetry.sink().recorder(Role::Drafter, "cuda:0");
        let threads = telemetry.registry().threads();
        let t0 = clock::now_ns();
        // Ten hub ticks, 100 ms apart: 4 device allocations and 4 frees a tick.
        for k in 0..10u64 {
            let alloc = [AllocatorSample {
                cuda: 0,
                stats: AllocatorStats {
                    reserved_bytes: 13 << 30,
                    allocated_bytes: 3 << 30,
                    segments: 42,
                    device_allocs: 100 + 4 * k,
                    device_frees: 90 + 4 * k,
                    alloc_retries: 0,
                    graph_events: 0,
                },
            }];
            fanout.tick(&TickInput {
                now_ns: t0 + k * 100_000_000,
                threads: &threads,
                queues: &[],
                counters: &[],
                switches: telemetry.switches(),
                dropped: 0,
                allocator: &alloc,
                gpus: &[],
            });
        }
        rec.finish().unwrap();
        let Recording::Frames(msgs) = read(&path).unwrap() else {
            panic!("not a frame recording")
        };
        let kept: Vec<&WireAlloc> = msgs
            .iter()
            .filter_map(|m| match m {
                Msg::Sample(s) => s.alloc.first(),
                _ => None,
            })
            .collect();
        // Ticks 0 and 5.
        assert_eq!(
            kept.iter().map(|a| a.allocs).collect::<Vec<_>>(),
            [100, 120]
        );
        let mut sim = super::super::replay::Sim::new(msgs).unwrap();
        let snaps = sim.seek(sim.duration_s()).unwrap();
        let a = &snaps.last().unwrap().allocator[0];
        assert_eq!((a.cuda, a.segments, a.reserved_bytes), (0, 42, 13 << 30));
        assert_eq!((a.device_allocs, a.device_frees), (120, 110));
        // 40 allocations and frees over the half second between the recorded samples.
        assert!((a.churn_per_s - 80.0).abs() < 1e-6, "{a:?}");
    }
}
