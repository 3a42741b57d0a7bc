//! The trainer's socket: `$XDG_RUNTIME_DIR/dflash-top/<pid>.sock` (else a per-user directory in
//! the temp dir), mode 0600 in a 0700 directory, peers of another uid refused. Each viewer gets
//! an outlet of the fan-out, a writer thread that may block on a slow viewer (only that viewer
//! then loses frames, counted) and a reader thread for its commands.

use super::fanout::{pump, Fanout, Outlet};
use super::protocol::*;
use crate::cancel::CancelToken;
use crate::telemetry::Telemetry;
use anyhow::{Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Data frames a viewer may fall behind by (about ten seconds of a busy run) before it loses any.
pub const VIEWER_BACKLOG: usize = 1024;

/// The directory sessions' sockets live in, created 0700 when missing.
pub fn socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join("dflash-top"),
        // SAFETY: getuid has no preconditions.
        None => std::env::temp_dir().join(format!("dflash-top-{}", unsafe { libc::getuid() })),
    }
}

pub fn socket_path(pid: u32) -> PathBuf {
    socket_dir().join(format!("{pid}.sock"))
}

/// The uid of the process at the other end of a Unix socket (SO_PEERCRED).
pub fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the buffer is a ucred we own and `len` says its size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Whether a peer may watch: only processes of the user who runs the trainer.
pub fn peer_allowed(peer_uid: u32, our_uid: u32) -> Result<(), String> {
    if peer_uid == our_uid {
        Ok(())
    } else {
        Err(format!(
            "refused: this session belongs to uid {our_uid} and the viewer runs as uid \
             {peer_uid}; attach as the user who started it"
        ))
    }
}

struct Conn {
    stream: UnixStream,
    outlet: Arc<Outlet>,
    threads: Vec<JoinHandle<()>>,
}

/// The listening socket and its viewers; `stop` removes the socket file.
pub struct Server {
    pub path: PathBuf,
    cancel: CancelToken,
    accept: Option<JoinHandle<()>>,
    conns: Arc<Mutex<Vec<Conn>>>,
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
    pub fn start(fanout: &Arc<Fanout>, telemetry: &Telemetry) -> Result<Server> {
        Self::start_at(fanout, telemetry, &socket_path(std::process::id()))
    }

    pub fn start_at(fanout: &Arc<Fanout>, telemetry: &Telemetry, path: &Path) -> Result<Server> {
        let fanout = fanout.clone();
        let listener = bind(path)?;
        let cancel = CancelToken::new();
        let conns: Arc<Mutex<Vec<Conn>>> = Arc::default();
        let accept = {
            let (cancel, conns, telemetry) = (cancel.clone(), conns.clone(), telemetry.clone());
            std::thread::Builder::new()
                .name("wire-serve".into())
                .spawn(move || accept_loop(listener, &fanout, &telemetry, &conns, &cancel))?
        };
        Ok(Server {
            path: path.to_path_buf(),
            cancel,
            accept: Some(accept),
            conns,
        })
    }

    /// Viewers connected now.
    pub fn viewers(&self) -> usize {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .iter()
            .filter(|c| !c.outlet.closed.load(Relaxed))
            .count()
    }

    /// Data frames dropped so far for the viewers connected now (they read too slowly).
    pub fn frames_dropped(&self) -> u64 {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.iter().map(|c| c.outlet.dropped.load(Relaxed)).sum()
    }

    /// Stops accepting, disconnects every viewer, joins every thread, removes the socket.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.cancel.cancel();
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        let conns = std::mem::take(&mut *self.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for c in conns {
            close(c);
        }
        let _ = std::fs::remove_file(&self.path);
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

fn accept_loop(
    listener: UnixListener,
    fanout: &Arc<Fanout>,
    telemetry: &Telemetry,
    conns: &Mutex<Vec<Conn>>,
    cancel: &CancelToken,
) {
    let mut n = 0u64;
    while !cancel.is_cancelled() {
        match listener.accept() {
            Ok((stream, _)) => {
                n += 1;
                if let Some(c) = welcome(stream, n, fanout, telemetry) {
                    conns.lock().unwrap_or_else(|e| e.into_inner()).push(c);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
        // Let go of viewers that left.
        let mut list = conns.lock().unwrap_or_else(|e| e.into_inner());
        let (gone, kept): (Vec<Conn>, Vec<Conn>) = std::mem::take(&mut *list)
            .into_iter()
            .partition(|c| c.outlet.closed.load(Relaxed));
        *list = kept;
        drop(list);
        gone.into_iter().for_each(close);
    }
}

/// The handshake: our preamble, theirs (a wrong one gets a `Refused` with the reason), the uid
/// check; then the viewer's two threads.
fn welcome(
    mut stream: UnixStream,
    n: u64,
    fanout: &Arc<Fanout>,
    telemetry: &Telemetry,
) -> Option<Conn> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .ok()?;
    let refuse = |s: &mut UnixStream, reason: String| {
        let _ = write_msg(s, &Msg::Refused { reason });
        let _ = s.shutdown(std::net::Shutdown::Both);
    };
    write_preamble(&mut stream).ok()?;
    // SAFETY: getuid has no preconditions.
    let ours = unsafe { libc::getuid() };
    let allowed = peer_uid(&stream)
        .map_err(|e| format!("refused: cannot read the viewer's credentials ({e})"))
        .and_then(|uid| peer_allowed(uid, ours));
    if let Err(reason) = allowed {
        refuse(&mut stream, reason);
        return None;
    }
    if let Err(e) = read_preamble(&mut stream) {
        refuse(&mut stream, format!("refused: {e}"));
        return None;
    }
    stream.set_read_timeout(None).ok()?;
    stream.set_write_timeout(None).ok()?;
    let (outlet, rx) = Outlet::new(VIEWER_BACKLOG);
    fanout.attach(outlet.clone());
    let mut w = stream.try_clone().ok()?;
    let mut r = stream.try_clone().ok()?;
    let writer = {
        let outlet = outlet.clone();
        std::thread::Builder::new()
            .name(format!("wire-out-{n}"))
            .spawn(move || {
                let _ = pump(&outlet, &rx, &mut w);
                outlet.closed.store(true, Relaxed);
                let _ = w.shutdown(std::net::Shutdown::Both);
            })
            .ok()?
    };
    let reader = {
        let (outlet, telemetry) = (outlet.clone(), telemetry.clone());
        std::thread::Builder::new()
            .name(format!("wire-in-{n}"))
            .spawn(move || {
                while let Ok(Some(m)) = read_msg(&mut r) {
                    if let Msg::Command { cmd } = m {
                        telemetry.command(cmd);
                    }
                }
                outlet.closed.store(true, Relaxed);
                let _ = r.shutdown(std::net::Shutdown::Both);
            })
            .ok()?
    };
    Some(Conn {
        stream,
        outlet,
        threads: vec![writer, reader],
    })
}
