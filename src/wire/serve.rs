//! The trainer's socket: `$XDG_RUNTIME_DIR/dflash-top/<pid>.sock` (else a per-user directory in
//! the temp dir), mode 0600 in a 0700 directory, peers of another uid refused. Each viewer gets
//! an outlet of the fan-out, a writer thread that may block on a slow viewer (only that viewer
//! then loses frames, counted) and a reader thread for its commands (src/wire/serve/viewer.rs:
//! one connection's handshake and threads; here the listener, its accept loop and what the
//! viewers share).
//!
//! No client can stop the run or lock others out (`ServeLimits`): viewers are capped, and one
//! more is refused with a sentence; the handshake runs on a thread of its own under a deadline,
//! so a connection that sends nothing holds up nobody; a viewer is refused when the process
//! nears its open-file limit, keeping a reserve for checkpoints; checkpoints asked for over the
//! socket are rate-limited; a viewer that paused the run and left un-pauses it.

use super::fanout::{Fanout, Outlet};
use crate::cancel::CancelToken;
use crate::telemetry::{HubCommand, Telemetry};
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
mod access;
mod viewer;
pub use access::*;
use viewer::{refuse_now, welcome};

struct Conn {
    stream: UnixStream,
    outlet: Arc<Outlet>,
    threads: Vec<JoinHandle<()>>,
}

/// What the accept loop, the handshakes and every viewer's reader share.
struct Shared {
    fanout: Arc<Fanout>,
    telemetry: Telemetry,
    limits: ServeLimits,
    cancel: CancelToken,
    conns: Mutex<Vec<Conn>>,
    /// Connections in their handshake (they count towards the cap).
    pending: AtomicUsize,
    handshakes: Mutex<Vec<JoinHandle<()>>>,
    /// Viewers whose last word on pause was "pause" (cleared by any "resume").
    pausers: Mutex<BTreeSet<u64>>,
    last_checkpoint: Mutex<Option<Instant>>,
    checkpoints_taken: AtomicU64,
    checkpoints_refused: AtomicU64,
    viewers_refused: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The listening socket and its viewers; `stop` removes the socket file.
pub struct Server {
    pub path: PathBuf,
    accept: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

fn bind(path: &Path) -> Result<UnixListener> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the socket directory {}", dir.display()))?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    // A file left by an earlier process of this pid is stale: we are that pid now.
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot make {} private (0600)", path.display()))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

impl Server {
    /// Serves `fanout` (a tap of `telemetry`'s hub) on this process's socket path.
    pub fn start(
        fanout: &Arc<Fanout>,
        telemetry: &Telemetry,
        limits: ServeLimits,
    ) -> Result<Server> {
        Self::start_with(fanout, telemetry, &socket_path(std::process::id()), limits)
    }

    /// Serves at `path` with the default limits.
    pub fn start_at(fanout: &Arc<Fanout>, telemetry: &Telemetry, path: &Path) -> Result<Server> {
        Self::start_with(fanout, telemetry, path, ServeLimits::default())
    }

    pub fn start_with(
        fanout: &Arc<Fanout>,
        telemetry: &Telemetry,
        path: &Path,
        limits: ServeLimits,
    ) -> Result<Server> {
        let listener = bind(path)?;
        let shared = Arc::new(Shared {
            fanout: fanout.clone(),
            telemetry: telemetry.clone(),
            limits,
            cancel: CancelToken::new(),
            conns: Mutex::default(),
            pending: AtomicUsize::new(0),
            handshakes: Mutex::default(),
            pausers: Mutex::default(),
            last_checkpoint: Mutex::new(None),
            checkpoints_taken: AtomicU64::new(0),
            checkpoints_refused: AtomicU64::new(0),
            viewers_refused: AtomicU64::new(0),
        });
        let accept = {
            let shared = shared.clone();
            let info = (
                info_path(path),
                telemetry.subscribe(),
                fanout.job().cloned(),
            );
            std::thread::Builder::new()
                .name("wire-serve".into())
                .spawn(move || accept_loop(listener, &shared, info))?
        };
        Ok(Server {
            path: path.to_path_buf(),
            accept: Some(accept),
            shared,
        })
    }

    /// Viewers connected now.
    pub fn viewers(&self) -> usize {
        self.shared.connected()
    }

    /// Data frames dropped so far for the viewers connected now (they read too slowly).
    pub fn frames_dropped(&self) -> u64 {
        let conns = lock(&self.shared.conns);
        conns.iter().map(|c| c.outlet.dropped.load(Relaxed)).sum()
    }

    /// Connections refused so far (over the cap, or near the open-file limit).
    pub fn viewers_refused(&self) -> u64 {
        self.shared.viewers_refused.load(Relaxed)
    }

    /// Checkpoint requests from viewers passed on to the engine, and those refused by the rate
    /// limit.
    pub fn checkpoint_requests(&self) -> (u64, u64) {
        (
            self.shared.checkpoints_taken.load(Relaxed),
            self.shared.checkpoints_refused.load(Relaxed),
        )
    }

    /// Stops accepting, disconnects every viewer, joins every thread, removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.cancel.cancel();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        // Each handshake ends by its deadline.
        for h in std::mem::take(&mut *lock(&self.shared.handshakes)) {
            let _ = h.join();
        }
        for c in std::mem::take(&mut *lock(&self.shared.conns)) {
            close(c);
        }
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_file(info_path(&self.path));
    }
}

/// Beside the socket, what `attach --list` shows of a session without joining it (written by
/// the session about once a second; a Python pipeline writes none).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SessionStats {
    pub step: u64,
    pub tok_per_s: f64,
    pub viewers: usize,
    /// The job the session is one rank of (`attach --job` finds its ranks by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<crate::job::JobTag>,
}

/// `<pid>.info` beside `<pid>.sock`.
pub fn info_path(socket: &Path) -> PathBuf {
    socket.with_extension("info")
}

/// Writes the stats file (a temporary file renamed over it: a reader never sees half of one).
fn write_info(path: &Path, stats: &SessionStats) {
    let tmp = path.with_extension("info.tmp");
    let Ok(text) = serde_json::to_vec(stats) else {
        return;
    };
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600));
        let _ = std::fs::rename(&tmp, path);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.accept.is_some() {
            self.shutdown();
        }
    }
}

fn close(c: Conn) {
    c.outlet.closed.store(true, Relaxed);
    let _ = c.stream.shutdown(std::net::Shutdown::Both);
    for h in c.threads {
        let _ = h.join();
    }
}

impl Shared {
    fn connected(&self) -> usize {
        lock(&self.conns)
            .iter()
            .filter(|c| !c.outlet.closed.load(Relaxed))
            .count()
    }

    /// Why one more connection may not join, if it may not.
    fn admission(&self) -> Result<(), String> {
        let held = self.connected() + self.pending.load(Relaxed);
        let cap = self.limits.max_viewers;
        if held >= cap {
            return Err(format!(
                "refused: this session already has {held} viewer{} and allows {cap}; detach \
                 one, or start the run with a higher --max-viewers (`max_viewers` in its TOML)",
                if held == 1 { "" } else { "s" }
            ));
        }
        match (open_files(), open_file_limit()) {
            (Some(open), Some(limit)) => fd_room(open, limit, self.limits.fd_reserve),
            _ => Ok(()),
        }
    }

    /// A command from viewer `n`: pause is remembered (undone when that viewer leaves), a
    /// checkpoint passes the rate limit or is refused with a note to that viewer.
    fn command(&self, n: u64, cmd: HubCommand, outlet: &Outlet) {
        match &cmd {
            HubCommand::SetPaused(true) => {
                lock(&self.pausers).insert(n);
            }
            HubCommand::SetPaused(false) => lock(&self.pausers).clear(),
            HubCommand::Checkpoint => {
                let mut last = lock(&self.last_checkpoint);
                let now = Instant::now();
                if let Some(ago) = last.map(|t| now.duration_since(t)) {
                    if ago < self.limits.checkpoint_every {
                        drop(last);
                        self.checkpoints_refused.fetch_add(1, Relaxed);
                        outlet.send_status(&format!(
                            "checkpoint not taken: one was asked for {:.0} s ago, and viewers \
                             may ask once every {} s",
                            ago.as_secs_f64(),
                            self.limits.checkpoint_every.as_secs()
                        ));
                        return;
                    }
                }
                *last = Some(now);
                self.checkpoints_taken.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        self.telemetry.command(cmd);
    }

    /// Viewer `n` left: a pause it asked for, and nobody else holds, is undone.
    fn left(&self, n: u64) {
        let mut pausers = lock(&self.pausers);
        if pausers.remove(&n) && pausers.is_empty() && self.telemetry.switches().paused() {
            drop(pausers);
            self.telemetry.command(HubCommand::SetPaused(false));
            self.telemetry.command(HubCommand::Status(
                "a viewer that paused the run left: training resumed".into(),
            ));
        }
    }
}

fn accept_loop(
    listener: UnixListener,
    shared: &Arc<Shared>,
    info: (
        PathBuf,
        crossbeam_channel::Receiver<Arc<crate::telemetry::Snapshot>>,
        Option<crate::job::JobTag>,
    ),
) {
    let mut n = 0u64;
    let (info_path, snapshots, job) = info;
    let mut written: Option<Instant> = None;
    while !shared.cancel.is_cancelled() {
        // The stats file, about once a second, from the newest snapshot.
        if let Some(s) = snapshots.try_iter().last() {
            if written.is_none_or(|w| w.elapsed() >= Duration::from_secs(1)) {
                let stats = SessionStats {
                    step: s.train.step,
                    tok_per_s: s.train.tok_per_s_1s,
                    viewers: shared.connected(),
                    job: job.clone(),
                };
                write_info(&info_path, &stats);
                written = Some(Instant::now());
            }
        }
        match listener.accept() {
            Ok((stream, _)) => {
                n += 1;
                if let Err(reason) = shared.admission() {
                    shared.viewers_refused.fetch_add(1, Relaxed);
                    refuse_now(stream, reason);
                } else {
                    shared.pending.fetch_add(1, Relaxed);
                    let sh = shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("wire-hello-{n}"))
                        .spawn(move || {
                            if let Some(c) = welcome(stream, n, &sh) {
                                lock(&sh.conns).push(c);
                            }
                            sh.pending.fetch_sub(1, Relaxed);
                        });
                    match spawned {
                        Ok(h) => lock(&shared.handshakes).push(h),
                        Err(_) => {
                            shared.pending.fetch_sub(1, Relaxed);
                            shared.viewers_refused.fetch_add(1, Relaxed);
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            // Out of descriptors (EMFILE) among others: the connection waits in the backlog.
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
        // Let go of handshakes that ended and viewers that left.
        lock(&shared.handshakes).retain(|h| !h.is_finished());
        let mut list = lock(&shared.conns);
        let (gone, kept): (Vec<Conn>, Vec<Conn>) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|c| c.outlet.closed.load(Relaxed));
        *list = kept;
        drop(list);
        gone.into_iter().for_each(close);
    }
}
