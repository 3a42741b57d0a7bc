//! One viewer's connection to the trainer's socket (src/wire/serve.rs): refused at once from the
//! accept loop when it may not join, else the handshake on a thread of its own under a deadline
//! (our preamble, the uid check, theirs), then the viewer's two threads: snapshots out through
//! its outlet of the fan-out, commands in.

use super::access::{peer_allowed, peer_uid, VIEWER_BACKLOG};
use super::{Conn, Shared};
use crate::wire::fanout::{pump, Outlet};
use crate::wire::protocol::*;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

/// Refuses a connection from the accept loop without waiting on it: the preamble and the
/// reason fit the empty socket buffer.
pub(super) fn refuse_now(stream: UnixStream, reason: String) {
    let mut s = stream;
    if s.set_nonblocking(true).is_ok() {
        let _ = write_preamble(&mut s);
        let _ = write_msg(&mut s, &Msg::Refused { reason });
        // Their preamble, if it came: unread bytes at close would reset the connection before
        // the reason is read.
        let _ = s.read(&mut [0u8; 64]);
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
}

/// Reads from a stream until a deadline, whatever the pace of the bytes.
struct Deadline<'a> {
    stream: &'a UnixStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut s = self.stream;
        s.read(buf)
    }
}

/// The handshake, on its own thread under the deadline: our preamble, theirs (a wrong one gets
/// a `Refused` with the reason), the uid check; then the viewer's two threads.
pub(super) fn welcome(mut stream: UnixStream, n: u64, shared: &Arc<Shared>) -> Option<Conn> {
    handshake(&mut stream, shared)?;
    if shared.cancel.is_cancelled() {
        return None;
    }
    stream.set_read_timeout(None).ok()?;
    stream.set_write_timeout(None).ok()?;
    serve_viewer(stream, n, shared)
}

/// Our preamble, the uid check, theirs under the deadline; `None` when the viewer was refused
/// (told why) or the stream failed.
fn handshake(stream: &mut UnixStream, shared: &Shared) -> Option<()> {
    let until = Instant::now() + shared.limits.handshake;
    stream.set_nonblocking(false).ok()?;
    stream
        .set_write_timeout(Some(shared.limits.handshake))
        .ok()?;
    let refuse = |s: &mut UnixStream, reason: String| {
        let _ = write_msg(s, &Msg::Refused { reason });
        let _ = s.shutdown(std::net::Shutdown::Both);
    };
    write_preamble(stream).ok()?;
    // SAFETY: getuid has no preconditions.
    let ours = unsafe { libc::getuid() };
    let allowed = peer_uid(stream)
        .map_err(|e| format!("refused: cannot read the viewer's credentials ({e})"))
        .and_then(|uid| peer_allowed(uid, ours));
    if let Err(reason) = allowed {
        refuse(stream, reason);
        return None;
    }
    let heard = read_preamble(&mut Deadline { stream, until });
    match heard {
        Ok(()) => {}
        Err(WireError::Io(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            refuse(
                stream,
                format!(
                    "refused: no handshake within {} s of connecting",
                    shared.limits.handshake.as_secs_f64()
                ),
            );
            return None;
        }
        Err(e) => {
            refuse(stream, format!("refused: {e}"));
            return None;
        }
    }
    Some(())
}

/// The viewer's two threads: snapshots out through its outlet, commands in.
fn serve_viewer(stream: UnixStream, n: u64, shared: &Arc<Shared>) -> Option<Conn> {
    let (outlet, rx) = Outlet::new(VIEWER_BACKLOG);
    let mut w = stream.try_clone().ok()?;
    let mut r = stream.try_clone().ok()?;
    shared.fanout.attach(outlet.clone());
    let writer = {
        let outlet = outlet.clone();
        std::thread::Builder::new()
            .name(format!("wire-out-{n}"))
            .spawn(move || {
                let _ = pump(&outlet, &rx, &mut w);
                outlet.closed.store(true, Relaxed);
                let _ = w.shutdown(std::net::Shutdown::Both);
            })
    };
    let writer = match writer {
        Ok(h) => h,
        Err(_) => {
            outlet.closed.store(true, Relaxed);
            return None;
        }
    };
    let reader = {
        let (outlet, shared) = (outlet.clone(), shared.clone());
        std::thread::Builder::new()
            .name(format!("wire-in-{n}"))
            .spawn(move || {
                while let Ok(Some(m)) = read_msg(&mut r) {
                    if let Msg::Command { cmd } = m {
                        shared.command(n, cmd, &outlet);
                    }
                }
                outlet.closed.store(true, Relaxed);
                let _ = r.shutdown(std::net::Shutdown::Both);
                shared.left(n);
            })
    };
    let reader = match reader {
        Ok(h) => vec![h],
        Err(_) => {
            outlet.closed.store(true, Relaxed);
            Vec::new()
        }
    };
    Some(Conn {
        stream,
        outlet,
        threads: std::iter::once(writer).chain(reader).collect(),
    })
}
