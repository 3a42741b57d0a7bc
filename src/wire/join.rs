//! The viewer: finds running sessions, joins one, and runs a local hub on its stream (with the
//! watched process's per-thread CPU from its /proc task list and GPUs through NVML here).
//! Leaving detaches; the watched run goes on.

use super::mirror::Mirror;
use super::protocol::*;
use super::serve::socket_dir;
use crate::cancel::CancelToken;
use crate::telemetry::warnings::WarnConfig;
use crate::telemetry::{HubCommand, Telemetry};
use anyhow::{anyhow, bail, Context, Result};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A session found in the socket directory.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionInfo {
    pub pid: u32,
    pub path: PathBuf,
    /// The process's command name (`dflash-top`, `python`).
    pub comm: String,
    /// When the process started (from /proc), seconds since the epoch.
    pub started: Option<i64>,
    /// What the session last wrote beside its socket (None: a Python pipeline, or a stale file).
    pub stats: Option<super::serve::SessionStats>,
}

/// A stats file older than this is a session that stopped writing: not shown.
const STATS_FRESH: Duration = Duration::from_secs(5);

/// When process `pid` started, seconds since the epoch (/proc/PID/stat's start time after the
/// boot time of /proc/stat).
pub fn process_start(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces), from field 3 on; start time is 22.
    let ticks: i64 = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()?;
    let btime: i64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| btime + ticks / hz as i64)
}

/// `14:03:12`: a time of day on this machine's clock (local time).
pub fn local_hms(unix_s: i64) -> String {
    // SAFETY: localtime_r writes only into the tm we own.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = unix_s as libc::time_t;
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return "--:--:--".into();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// The session's stats file, when it is fresh.
fn read_stats(socket: &Path) -> Option<super::serve::SessionStats> {
    let path = super::serve::info_path(socket);
    let age = std::fs::metadata(&path)
        .ok()?
        .modified()
        .ok()?
        .elapsed()
        .ok()?;
    if age > STATS_FRESH {
        return None;
    }
    serde_json::from_slice(&std::fs::read(&path).ok()?).ok()
}

/// Running sessions in `dir`; sockets of processes that are gone are removed on the way.
pub fn sessions_in(dir: &Path) -> Vec<SessionInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<SessionInfo> = entries
        .filter_map(|e| {
            let path = e.ok()?.path();
            let pid: u32 = path
                .file_name()?
                .to_str()?
                .strip_suffix(".sock")?
                .parse()
                .ok()?;
            if !crate::probe::alive(pid) {
                let _ = std::fs::remove_file(&path);
                let _ = std::fs::remove_file(super::serve::info_path(&path));
                return None;
            }
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_default();
            Some(SessionInfo {
                pid,
                comm,
                started: process_start(pid),
                stats: read_stats(&path),
                path,
            })
        })
        .collect();
    out.sort_by_key(|s| s.pid);
    out
}

pub fn sessions() -> Vec<SessionInfo> {
    sessions_in(&socket_dir())
}

/// The socket to join: a PID, a socket path, or the only running session.
pub fn resolve(target: Option<&str>) -> Result<PathBuf> {
    match target {
        Some(t) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
            let pid: u32 = t.parse().context("PID out of range")?;
            let path = super::serve::socket_path(pid);
            if !path.exists() {
                bail!(
                    "no dflash-top session for PID {pid} (no {}): run `dflash-top attach` to list them",
                    path.display()
                );
            }
            Ok(path)
        }
        Some(t) => Ok(PathBuf::from(t)),
        None => {
            let found = sessions();
            match found.as_slice() {
                [one] => Ok(one.path.clone()),
                [] => bail!(
                    "no running dflash-top session in {}: start `dflash-top train` or a pipeline \
                     instrumented with python/dflash_top",
                    socket_dir().display()
                ),
                many => bail!(
                    "{} sessions are running; pick one with `dflash-top attach PID`:\n{}",
                    many.len(),
                    list_text(many)
                ),
            }
        }
    }
}

/// The sockets to join for `attach TARGET...`: each a PID or a socket path, in the order given;
/// a path that is no socket is a sentence naming it.
pub fn resolve_all(targets: &[String]) -> Result<Vec<PathBuf>> {
    if targets.is_empty() {
        return Ok(vec![resolve(None)?]);
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for t in targets {
        let path = resolve(Some(t))?;
        if !is_socket(&path) {
            bail!(
                "{} is not a dflash-top session's socket ({}): give a PID or a socket of `dflash-top \
                 attach --list`, or a socket forwarded with `ssh -L`",
                path.display(),
                if path.exists() {
                    "it is no socket"
                } else {
                    "no such file"
                }
            );
        }
        if !out.contains(&path) {
            out.push(path);
        }
    }
    Ok(out)
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// The job a session is one rank of: from its stats file, else from its hello (a session that
/// has not written one yet).
pub fn job_of(s: &SessionInfo) -> Option<crate::job::JobTag> {
    if let Some(j) = s.stats.as_ref().and_then(|st| st.job.clone()) {
        return Some(j);
    }
    if s.stats.is_some() {
        return None;
    }
    let (stream, hello) = connect(&s.path).ok()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    hello.job
}

/// The sockets of every local rank of job `id` (`attach --job ID`), lowest rank first; with no
/// id, of the one job running here. None found, or several jobs when no id was given, is a
/// sentence that lists what there is.
pub fn resolve_job(id: Option<&str>) -> Result<Vec<PathBuf>> {
    let ranks: Vec<(crate::job::JobTag, PathBuf)> = sessions()
        .iter()
        .filter_map(|s| Some((job_of(s)?, s.path.clone())))
        .collect();
    pick_job(ranks, id, &socket_dir())
}

/// `resolve_job` over sessions already read: (job, socket) pairs.
pub fn pick_job(
    mut ranks: Vec<(crate::job::JobTag, PathBuf)>,
    id: Option<&str>,
    dir: &Path,
) -> Result<Vec<PathBuf>> {
    let mut ids: Vec<String> = ranks.iter().map(|(j, _)| j.id.clone()).collect();
    ids.sort();
    ids.dedup();
    let id = match (id, ids.as_slice()) {
        (Some(id), _) => id.to_string(),
        (None, [one]) => one.clone(),
        (None, []) => bail!(
            "no session of a multi-process job in {}: start the ranks with RANK, WORLD_SIZE, \
             MASTER_ADDR and MASTER_PORT set (torchrun sets them), or give sockets: `dflash-top \
             attach A.sock B.sock`",
            dir.display()
        ),
        (None, many) => bail!(
            "{} jobs are running here ({}); pick one with `dflash-top attach --job ID`",
            many.len(),
            many.join(", ")
        ),
    };
    ranks.retain(|(j, _)| j.id == id);
    if ranks.is_empty() {
        bail!(
            "no running session of job {id:?} in {}{}: `dflash-top attach --list` shows each \
             session's job",
            dir.display(),
            if ids.is_empty() {
                String::new()
            } else {
                format!(" (jobs here: {})", ids.join(", "))
            }
        );
    }
    ranks.sort_by_key(|(j, _)| (j.rank, j.local_rank));
    Ok(ranks.into_iter().map(|(_, p)| p).collect())
}

/// `6144`, `12.3K`: tokens a second, as the header shows them.
fn rate(v: f64) -> String {
    if v >= 1e4 {
        format!("{:.1}K", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// A table of the sessions: pid, command, start time, steps, tok/s, viewers, socket (`–` where
/// the session writes no stats: a Python pipeline).
pub fn list_text(found: &[SessionInfo]) -> String {
    let mut lines = vec![format!(
        "  {:>8}  {:<16} {:<8}  {:>8}  {:>8}  {:>7}  {}",
        "PID", "COMMAND", "STARTED", "STEPS", "TOK/S", "VIEWERS", "SOCKET"
    )];
    for s in found {
        let (step, tok, viewers) = match &s.stats {
            Some(st) => (
                st.step.to_string(),
                rate(st.tok_per_s),
                st.viewers.to_string(),
            ),
            None => ("–".into(), "–".into(), "–".into()),
        };
        let job = s
            .stats
            .as_ref()
            .and_then(|st| st.job.as_ref())
            .map(|j| format!("  job {} rank {}/{}", j.id, j.rank, j.world))
            .unwrap_or_default();
        lines.push(format!(
            "  {:>8}  {:<16} {:<8}  {:>8}  {:>8}  {:>7}  {}{job}",
            s.pid,
            s.comm,
            s.started.map(local_hms).unwrap_or_else(|| "–".into()),
            step,
            tok,
            viewers,
            s.path.display()
        ));
    }
    lines.join("\n")
}

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

/// `dflash-top attach` with no session to join: the list, or why there is none.
pub fn describe_sessions() -> Result<String> {
    let found = sessions();
    if found.is_empty() {
        return Err(anyhow!(
            "no running dflash-top session in {}",
            socket_dir().display()
        ));
    }
    Ok(list_text(&found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobTag;

    fn tag(id: &str, rank: u32) -> JobTag {
        JobTag {
            id: id.into(),
            rank,
            world: 2,
            local_rank: rank,
            host: "h".into(),
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            agent_store: false,
        }
    }

    #[test]
    fn attach_job_picks_the_ranks_of_one_job_or_says_which_there_are() {
        let dir = Path::new("/run/dflash-top");
        let ranks = vec![
            (tag("a", 1), PathBuf::from("a1.sock")),
            (tag("a", 0), PathBuf::from("a0.sock")),
        ];
        let got = pick_job(ranks.clone(), None, dir).unwrap();
        assert_eq!(got, [PathBuf::from("a0.sock"), PathBuf::from("a1.sock")]);
        let mut two = ranks.clone();
        two.push((tag("b", 0), PathBuf::from("b0.sock")));
        let e = pick_job(two.clone(), None, dir).unwrap_err().to_string();
        assert!(
            e.contains("2 jobs") && e.contains("a, b") && e.contains("--job ID"),
            "{e}"
        );
        assert_eq!(
            pick_job(two, Some("b"), dir).unwrap(),
            [PathBuf::from("b0.sock")]
        );
        let e = pick_job(ranks, Some("c"), dir).unwrap_err().to_string();
        assert!(e.contains("job \"c\"") && e.contains("jobs here: a"), "{e}");
        let e = pick_job(Vec::new(), None, dir).unwrap_err().to_string();
        assert!(e.contains("no session of a multi-process job"), "{e}");
    }
}
