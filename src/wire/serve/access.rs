//! Where the socket lives and who may use it: the socket's directory and path, the peer's uid
//! (only the session's own user), and the limits that keep any client from stopping the run or
//! locking others out (viewers at once, the handshake's deadline, the open files kept for
//! checkpoints, checkpoints asked for over the socket).

use anyhow::Result;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

/// Data frames a viewer may fall behind by (about ten seconds of a busy run) before it loses any.
pub const VIEWER_BACKLOG: usize = 1024;
/// Viewers at once by default (`--max-viewers`, `max_viewers` in the TOML).
pub const DEFAULT_MAX_VIEWERS: usize = 16;
/// The most `--max-viewers` may be.
pub const MAX_VIEWERS_LIMIT: usize = 256;
/// Time a new connection has for the whole handshake (its preamble in, ours out).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);
/// Least time between two checkpoints asked for over the socket, all viewers together.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(30);
/// Open files kept free for the engine (a checkpoint's files, data, libraries): a viewer that
/// would eat into them is refused.
pub const FD_RESERVE: u64 = 128;
/// Open files one viewer holds: its stream and the writer's and reader's clones.
pub const FDS_PER_VIEWER: u64 = 3;

/// What the socket lets clients take and ask for.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Viewers connected or in their handshake at once; the next is refused with a sentence.
    pub max_viewers: usize,
    /// Time a connection has for its handshake.
    pub handshake: Duration,
    /// Least time between two checkpoint requests taken from viewers.
    pub checkpoint_every: Duration,
    /// Open files a new viewer must leave free under the process's limit.
    pub fd_reserve: u64,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_viewers: DEFAULT_MAX_VIEWERS,
            handshake: HANDSHAKE_DEADLINE,
            checkpoint_every: CHECKPOINT_EVERY,
            fd_reserve: FD_RESERVE,
        }
    }
}

/// The process's soft limit on open files (None: unlimited or unreadable).
pub fn open_file_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: the buffer is an rlimit we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// Files this process has open now (None where /proc cannot be read).
pub fn open_files() -> Option<u64> {
    // The directory's own descriptor is counted too: one over, on the safe side.
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| d.count() as u64)
}

/// Whether one more viewer fits under the open-file `limit` with `open` in use, leaving
/// `reserve` free; else the refusal.
pub fn fd_room(open: u64, limit: u64, reserve: u64) -> Result<(), String> {
    if open.saturating_add(FDS_PER_VIEWER + reserve) > limit {
        Err(format!(
            "refused: the session has {open} of its {limit} open files in use and keeps \
             {reserve} free for its checkpoints; detach another viewer, or raise the limit \
             (`ulimit -n`) before starting the run"
        ))
    } else {
        Ok(())
    }
}

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
