//! A recording played under the viewer's control: pause, seek, speed. The frame stream is
//! simulated offline (a mirror and an assembler fed its frames at recorded times, one tick every
//! 100 ms of recorded time), so any moment of it can be reached at once: forward by running on,
//! backward by running again from the start. A player thread turns wall time into recorded time
//! at the chosen speed and sends the snapshots on.

use super::mirror::Mirror;
use super::protocol::{Hello, Msg};
use crate::cancel::CancelToken;
use crate::telemetry::assemble::Assembler;
use crate::telemetry::names::Names;
use crate::telemetry::window::TICK_NS;
use crate::telemetry::{clock, HubCommand, Snapshot, Telemetry};
use anyhow::{bail, Result};
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a seek keeps before the moment it lands on, so the timeline has its ten seconds.
pub const SEEK_CONTEXT_S: f64 = 10.0;
/// What `<` / `>` (and the arrows) move by.
pub const SEEK_STEP_S: f64 = 10.0;
/// Recorded time `max` speed plays per wall second.
const MAX_SPEED: f64 = 50.0;

/// How fast the recording plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speed {
    X1,
    X2,
    X4,
    Max,
}

impl Speed {
    pub const ALL: [Speed; 4] = [Speed::X1, Speed::X2, Speed::X4, Speed::Max];

    pub fn name(self) -> &'static str {
        match self {
            Speed::X1 => "1x",
            Speed::X2 => "2x",
            Speed::X4 => "4x",
            Speed::Max => "max",
        }
    }

    fn factor(self) -> f64 {
        match self {
            Speed::X1 => 1.0,
            Speed::X2 => 2.0,
            Speed::X4 => 4.0,
            Speed::Max => MAX_SPEED,
        }
    }

    /// The next speed up (`faster`) or down; it stays at the ends.
    pub fn step(self, faster: bool) -> Speed {
        let i = Speed::ALL.iter().position(|s| *s == self).unwrap_or(0);
        let j = if faster {
            (i + 1).min(Speed::ALL.len() - 1)
        } else {
            i.saturating_sub(1)
        };
        Speed::ALL[j]
    }
}

/// Where the replay is: what the position bar shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ReplayPos {
    pub position_s: f64,
    pub duration_s: f64,
    pub paused: bool,
    pub speed: Speed,
    /// The last moment of the recording has been shown.
    pub at_end: bool,
}

/// A recording's frames run through a mirror and an assembler in recorded time.
pub struct Sim {
    msgs: Arc<Vec<Msg>>,
    hello: Hello,
    /// Recorded time of the first sample (position 0) and of the last frame, wire ns.
    start: u64,
    end: u64,
    telemetry: Telemetry,
    mirror: Mirror,
    asm: Assembler,
    next: usize,
    /// Wire time of the next tick.
    tick: u64,
    /// Wire time to local time.
    shift: i128,
}

/// A frame's recorded time, for those that have one.
fn time_of(m: &Msg) -> Option<u64> {
    match m {
        Msg::Sample(s) => Some(s.now),
        Msg::Step(s) => Some(s.end),
        _ => None,
    }
}

impl Sim {
    pub fn new(msgs: Vec<Msg>) -> Result<Sim> {
        let Some(Msg::Hello(hello)) = msgs.first().cloned() else {
            bail!("the recording has no hello");
        };
        let start = msgs
            .iter()
            .find_map(|m| match m {
                Msg::Sample(s) => Some(s.now),
                _ => None,
            })
            .unwrap_or(hello.now_ns);
        let end = msgs.iter().filter_map(time_of).max().unwrap_or(start);
        // Recorded times land near now (threads declared get now's clock), the same on every
        // run from the start: a seek back goes back in the snapshots' time too.
        let shift = clock::to_monotonic(clock::now_ns()) as i128 - start as i128;
        Sim::from_start(Arc::new(msgs), hello, (start, end.max(start)), shift)
    }

    fn from_start(msgs: Arc<Vec<Msg>>, hello: Hello, span: (u64, u64), shift: i128) -> Result<Sim> {
        let (start, end) = span;
        let mut telemetry = Telemetry::new();
        telemetry.probes = false;
        let mut mirror = Mirror::new(&hello, &telemetry, shift)?;
        // The recorded GPUs (a recording made since the samples carry them), under the host
        // that recorded them.
        mirror.show_gpus_of(super::join::host_of(&hello).unwrap_or("recorded"));
        // Switches follow the recording, not keys.
        let (tx, _rx) = unbounded();
        telemetry.forward_commands(tx);
        let mut asm = Assembler::new(mirror.local(start));
        asm.ns_per_mark = hello.ns_per_mark;
        asm.set_cpu_absent("per-thread CPU: not in recordings");
        asm.set_gpu_absent("not in this recording");
        Ok(Sim {
            msgs,
            hello,
            start,
            end,
            telemetry,
            mirror,
            asm,
            next: 1,
            tick: start + TICK_NS,
            shift,
        })
    }

    /// The recording's length, seconds from its first sample to its last frame.
    pub fn duration_s(&self) -> f64 {
        (self.end - self.start) as f64 / 1e9
    }

    /// The recorded time of the last snapshot made, seconds from the start.
    pub fn position_s(&self) -> f64 {
        (self.tick - TICK_NS).saturating_sub(self.start) as f64 / 1e9
    }

    /// Every frame applied and the last tick made.
    pub fn at_end(&self) -> bool {
        self.next >= self.msgs.len() && self.tick > self.end
    }

    fn restart(&mut self) -> Result<()> {
        let span = (self.start, self.end);
        *self = Sim::from_start(self.msgs.clone(), self.hello.clone(), span, self.shift)?;
        Ok(())
    }

    /// Runs on to `to_s` (past the end: to the end), keeping the snapshots of ticks after
    /// `keep_from_s`.
    fn run_to(&mut self, to_s: f64, keep_from_s: f64) -> Vec<Snapshot> {
        let to = self.start + (to_s.max(0.0) * 1e9) as u64;
        let keep_from = self.start + (keep_from_s.max(0.0) * 1e9) as u64;
        let mut out = Vec::new();
        while self.tick <= to && !self.at_end() {
            while let Some(m) = self.msgs.get(self.next) {
                if time_of(m).is_some_and(|t| t > self.tick) {
                    break;
                }
                self.mirror.apply(m.clone());
                self.next += 1;
                // The record channel is bounded: take what a frame sent before the next.
                while let Ok(r) = self.telemetry.records().try_recv() {
                    self.asm.ingest(&r);
                }
            }
            if let Some((host, gpus)) = self.telemetry.take_remote_gpus() {
                self.asm.set_gpus_of(Some(&host), gpus);
            }
            for c in self.telemetry.take_commands() {
                match c {
                    HubCommand::Status(s) => self.asm.set_status(s),
                    HubCommand::ResetWindows => self.asm.reset_windows(),
                    _ => {}
                }
            }
            let now = self.mirror.local(self.tick);
            self.asm.set_names(self.telemetry.names());
            let mut snap = self.asm.tick(
                now,
                &self.telemetry.registry().threads(),
                &self.telemetry.queue_probes(),
                self.telemetry.switches(),
                self.telemetry.dropped(),
            );
            snap.allocator = self.telemetry.remote_allocator();
            snap.sync_sites = self.telemetry.sync_sites();
            if self.tick > keep_from {
                out.push(snap);
            }
            self.tick += TICK_NS;
        }
        out
    }

    /// Moves to `to_s` (clamped to the recording): the snapshots of the `SEEK_CONTEXT_S` before
    /// it, the last one at it. Backward runs again from the start.
    pub fn seek(&mut self, to_s: f64) -> Result<Vec<Snapshot>> {
        // At least one tick in: a seek to the start shows its first snapshot.
        let tick_s = TICK_NS as f64 / 1e9;
        let to_s = to_s.clamp(tick_s, self.duration_s().max(tick_s));
        if to_s < self.position_s() {
            self.restart()?;
        }
        Ok(self.run_to(to_s, to_s - SEEK_CONTEXT_S))
    }

    /// Plays on to `to_s` of recorded time (a tick at most every 100 ms of it): every snapshot
    /// on the way.
    pub fn play_to(&mut self, to_s: f64) -> Vec<Snapshot> {
        self.run_to(to_s, 0.0)
    }
}

/// A recording of either format, as something to play.
pub enum Source {
    Frames(Box<Sim>),
    /// Recordings of earlier versions: one snapshot a line, played by their `elapsed_s`.
    Snapshots {
        snaps: Vec<Snapshot>,
        next: usize,
    },
}

impl Source {
    pub fn new(rec: super::recording::Recording) -> Result<Source> {
        Ok(match rec {
            super::recording::Recording::Frames(msgs) => Source::Frames(Box::new(Sim::new(msgs)?)),
            super::recording::Recording::Snapshots(snaps) => Source::Snapshots { snaps, next: 0 },
        })
    }

    /// The names of the recorded pipeline as it starts.
    pub fn names(&self) -> Arc<Names> {
        match self {
            Source::Frames(sim) => sim.telemetry.names(),
            Source::Snapshots { snaps, .. } => {
                snaps.first().map(|s| s.names.clone()).unwrap_or_default()
            }
        }
    }

    pub fn duration_s(&self) -> f64 {
        match self {
            Source::Frames(sim) => sim.duration_s(),
            Source::Snapshots { snaps, .. } => snaps.last().map_or(0.0, |s| s.elapsed_s),
        }
    }

    pub fn position_s(&self) -> f64 {
        match self {
            Source::Frames(sim) => sim.position_s(),
            Source::Snapshots { snaps, next } => {
                next.checked_sub(1).map_or(0.0, |i| snaps[i].elapsed_s)
            }
        }
    }

    pub fn at_end(&self) -> bool {
        match self {
            Source::Frames(sim) => sim.at_end(),
            Source::Snapshots { snaps, next } => *next >= snaps.len(),
        }
    }

    pub fn seek(&mut self, to_s: f64) -> Result<Vec<Snapshot>> {
        match self {
            Source::Frames(sim) => sim.seek(to_s),
            Source::Snapshots { snaps, next } => {
                let to = snaps.partition_point(|s| s.elapsed_s <= to_s).max(1);
                let from = snaps[..to].partition_point(|s| s.elapsed_s < to_s - SEEK_CONTEXT_S);
                *next = to.min(snaps.len());
                Ok(snaps[from.min(*next)..*next].to_vec())
            }
        }
    }

    /// Plays on to `to_s` of recorded time: every snapshot on the way.
    pub fn play_to(&mut self, to_s: f64) -> Vec<Snapshot> {
        match self {
            Source::Frames(sim) => sim.play_to(to_s),
            Source::Snapshots { snaps, next } => {
                let end = snaps.partition_point(|s| s.elapsed_s <= to_s).max(*next);
                let out = snaps[*next..end].to_vec();
                *next = end;
                out
            }
        }
    }
}

/// What the viewer asks of the player, and where it is.
#[derive(Debug)]
struct Shared {
    pos: ReplayPos,
    seek_to: Option<f64>,
}

/// A recording playing on a thread of its own; the viewer steers it through this handle.
pub struct Player {
    shared: Arc<Mutex<Shared>>,
    pub snapshots: Receiver<Arc<Snapshot>>,
    /// The names of the recorded pipeline as it starts.
    pub names: Arc<Names>,
    stop: CancelToken,
    thread: Option<JoinHandle<()>>,
}

impl Player {
    pub fn start(mut source: Source) -> Result<Player> {
        let duration_s = source.duration_s();
        let names = source.names();
        let shared = Arc::new(Mutex::new(Shared {
            pos: ReplayPos {
                position_s: 0.0,
                duration_s,
                paused: false,
                speed: Speed::X1,
                at_end: false,
            },
            seek_to: None,
        }));
        let (tx, rx) = unbounded();
        let stop = CancelToken::new();
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("replay".into())
                .spawn(move || play(&mut source, &shared, &tx, &stop))?
        };
        Ok(Player {
            shared,
            snapshots: rx,
            names,
            stop,
            thread: Some(thread),
        })
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn pos(&self) -> ReplayPos {
        self.shared().pos
    }

    pub fn set_paused(&self, paused: bool) {
        self.shared().pos.paused = paused;
    }

    /// Moves by `delta_s` from where the replay is (or is already going); returns the target.
    pub fn seek_by(&self, delta_s: f64) -> f64 {
        let mut s = self.shared();
        let from = s.seek_to.unwrap_or(s.pos.position_s);
        let to = (from + delta_s).clamp(0.0, s.pos.duration_s);
        s.seek_to = Some(to);
        // Said at once: the screen and the end check follow the key, not the player's turn.
        s.pos.position_s = to;
        s.pos.at_end = false;
        to
    }

    pub fn set_speed(&self, speed: Speed) {
        self.shared().pos.speed = speed;
    }

    pub fn stop(mut self) {
        self.stop.cancel();
        if let Some(h) = self.thread.take() {
            let _ = h.join();
        }
    }
}

/// The player's loop: seeks first, then recorded time at the chosen speed.
fn play(
    source: &mut Source,
    shared: &Mutex<Shared>,
    tx: &Sender<Arc<Snapshot>>,
    stop: &CancelToken,
) {
    let lock = || shared.lock().unwrap_or_else(|e| e.into_inner());
    let mut last = Instant::now();
    // Recorded time played so far (the source moves in ticks; this in wall time x speed).
    let mut clock = 0.0f64;
    let duration = source.duration_s();
    while !stop.is_cancelled() {
        std::thread::sleep(Duration::from_millis(20));
        let elapsed = last.elapsed().as_secs_f64();
        last = Instant::now();
        let (seek, pos) = {
            let mut s = lock();
            (s.seek_to.take(), s.pos)
        };
        let snaps = match seek {
            Some(to) => {
                clock = to;
                source.seek(to).unwrap_or_default()
            }
            None if pos.paused || source.at_end() => continue,
            None => {
                clock = (clock + elapsed * pos.speed.factor()).min(duration + 1.0);
                source.play_to(clock)
            }
        };
        {
            let mut s = lock();
            if s.seek_to.is_none() {
                s.pos.position_s = source.position_s();
                s.pos.at_end = source.at_end();
            }
        }
        for snap in snaps {
            if tx.send(Arc::new(snap)).is_err() {
                return;
            }
        }
    }
}
