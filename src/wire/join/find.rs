//! Finding the running sessions: the socket directory's sockets with their processes and stats
//! files (`attach --list`), and a PID, socket or job id resolved to the sockets to join.

use super::connect;
use crate::wire::serve::socket_dir;
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
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
    pub stats: Option<crate::wire::serve::SessionStats>,
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
fn read_stats(socket: &Path) -> Option<crate::wire::serve::SessionStats> {
    let path = crate::wire::serve::info_path(socket);
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
                let _ = std::fs::remove_file(crate::wire::serve::info_path(&path));
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
            let path = crate::wire::serve::socket_path(pid);
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
