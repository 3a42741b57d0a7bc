//! The viewer: finds running sessions (`join/find.rs`: the socket directory, `attach --list`,
//! PIDs, sockets and jobs resolved), joins one, and runs a local hub on its stream (with the
//! watched process's per-thread CPU from its /proc task list and GPUs through NVML here).
//! Leaving detaches; the watched run goes on.

use super::mirror::Mirror;
use super::protocol::*;
use crate::cancel::CancelToken;
use crate::telemetry::warnings::WarnConfig;
use crate::telemetry::{HubCommand, Telemetry};
use anyhow::{bail, Context, Result};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

mod find;
pub use find::*;

/// Connects and does the handshake; returns the stream and the producer's hello.
pub fn connect(path: &Path) -> Result<(UnixStream, Hello)> {
    let mut s = UnixStream::connect(path).with_context(|| {
        format!(
            "cannot connect to {}: the session has ended or the path is not a dflash-top socket",
            path.display()
        )
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // A session that refuses us at once (too many viewers) may have closed before our preamble
    // went out: its reason is still there to read.
    let wrote = write_preamble(&mut s);
    read_preamble(&mut s).with_context(|| format!("{}", path.display()))?;
    let first = read_msg(&mut s).with_context(|| format!("{}", path.display()));
    if let Ok(Some(Msg::Refused { reason })) = &first {
        bail!("{}: {reason}", path.display());
    }
    wrote.with_context(|| format!("{}", path.display()))?;
    let hello = match first? {
        Some(Msg::Hello(h)) => h,
        Some(Msg::Refused { reason }) => bail!("{}: {reason}", path.display()),
        Some(other) => bail!("{}: expected a hello, got {other:?}", path.display()),
        None => bail!("{}: the session closed the connection", path.display()),
    };
    s.set_read_timeout(None)?;
    Ok((s, hello))
}

/// Whether the session's process runs on this host: its hello's host (or its job's) says so,
/// else (a producer that names none) its PID is alive here.
pub fn on_this_host(hello: &Hello) -> bool {
    match host_of(hello) {
        Some(h) => h == crate::job::hostname(),
        None => crate::probe::alive(hello.pid),
    }
}

/// The host the session says it runs on.
pub fn host_of(hello: &Hello) -> Option<&str> {
    hello
        .host
        .as_deref()
        .or(hello.job.as_ref().map(|j| j.host.as_str()))
}

/// A joined session: a local hub fed by the socket.
pub struct Attached {
    pub telemetry: Telemetry,
    pub hello: Hello,
    /// Set when the stream ended (the watched run finished, or the connection broke).
    pub ended: Arc<AtomicBool>,
    pub end_reason: Arc<std::sync::Mutex<Option<String>>>,
    stream: UnixStream,
    stop: CancelToken,
    threads: Vec<JoinHandle<()>>,
    hub_cancel: CancelToken,
    hub: Option<JoinHandle<()>>,
}

impl Attached {
    /// ` on HOST` when the session runs on another host (a socket forwarded from there); empty
    /// for this host's.
    pub fn on_host(&self) -> String {
        match self.telemetry.probes {
            true => String::new(),
            false => format!(" on {}", host_of(&self.hello).unwrap_or("another host")),
        }
    }

    pub fn join(path: &Path) -> Result<Attached> {
        Self::join_with(
            path,
            WarnConfig::default(),
            crate::telemetry::verdict::DWELL_NS,
        )
    }

    /// `join`, the warning rules set by `warnings` (the viewer's `[warnings]`) and a verdict
    /// change shown once it held `dwell_ns` (`verdict_dwell`).
    pub fn join_with(path: &Path, warnings: WarnConfig, dwell_ns: u64) -> Result<Attached> {
        let (stream, hello) = connect(path)?;
        let mut telemetry = Telemetry::new();
        telemetry.warnings = warnings;
        telemetry.verdict_dwell_ns = dwell_ns;
        telemetry.watched_pid = Some(hello.pid);
        // A socket forwarded from another host (`ssh -L`): its PID means nothing in this /proc
        // and its GPUs are not this host's.
        telemetry.probes = on_this_host(&hello);
        telemetry.ns_per_mark = Some(hello.ns_per_mark);
        let mut mirror = Mirror::new(&hello, &telemetry, 0)?;
        if !telemetry.probes {
            mirror.on_other_host(host_of(&hello).unwrap_or("another host"));
        }
        let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded::<HubCommand>();
        telemetry.forward_commands(cmd_tx);
        let ended = Arc::new(AtomicBool::new(false));
        let end_reason = Arc::new(std::sync::Mutex::new(None));
        let stop = CancelToken::new();
        let mut r = stream.try_clone()?;
        let reader = {
            let (ended, end_reason) = (ended.clone(), end_reason.clone());
            std::thread::Builder::new()
                .name("attach-in".into())
                .spawn(move || {
                    let why = loop {
                        match read_msg(&mut r) {
                            Ok(Some(m)) => mirror.apply(m),
                            Ok(None) => break "the session ended".to_string(),
                            Err(e) => break format!("connection lost: {e}"),
                        }
                    };
                    *end_reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                    ended.store(true, Ordering::SeqCst);
                })?
        };
        let mut w = stream.try_clone()?;
        let writer = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("attach-out".into())
                .spawn(move || {
                    while !stop.is_cancelled() {
                        if let Ok(cmd) = cmd_rx.recv_timeout(Duration::from_millis(50)) {
                            if write_msg(&mut w, &Msg::Command { cmd }).is_err() {
                                return;
                            }
                        }
                    }
                })?
        };
        let hub_cancel = CancelToken::new();
        let hub = telemetry.spawn_hub(hub_cancel.clone())?;
        Ok(Attached {
            telemetry,
            hello,
            ended,
            end_reason,
            stream,
            stop,
            threads: vec![reader, writer],
            hub_cancel,
            hub: Some(hub),
        })
    }

    /// Why the stream ended, once it has.
    pub fn end_reason(&self) -> Option<String> {
        self.end_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Leaves: closes the connection (the watched run goes on) and joins every thread.
    pub fn detach(mut self) {
        self.stop.cancel();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        self.hub_cancel.cancel();
        if let Some(h) = self.hub.take() {
            let _ = h.join();
        }
    }
}
