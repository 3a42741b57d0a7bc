//! Per-thread CPU and OS state of this process, read from its own task list
//! (`/proc/self/task/TID/stat`: comm, state, utime + stime), and its memory through sysinfo
//! (this pid only). No other process is read: a refresh costs the same on a busy host as on an
//! idle one.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;
use sysinfo::{MemoryRefreshKind, Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// One OS thread of this process as last sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadCpu {
    pub tid: i32,
    /// The kernel's name of the thread (`comm`, at most 15 bytes).
    pub name: String,
    /// Percent of one core since the previous sample.
    pub cpu_pct: f32,
    /// The kernel's state letter: R running, S sleeping, D blocked in I/O, T stopped, Z zombie, …
    pub state: char,
}

/// Resident memory of this process and memory of the host, MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemorySample {
    pub rss_mib: u64,
    pub host_used_mib: u64,
    pub host_total_mib: u64,
}

/// One refresh: every thread of this process, and its memory when sysinfo could read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSample {
    pub threads: HashMap<i32, ThreadCpu>,
    pub memory: Option<MemorySample>,
}

/// One line of `/proc/self/task/TID/stat`, the fields we use.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskStat {
    pub tid: i32,
    pub comm: String,
    pub state: char,
    /// utime + stime, in clock ticks.
    pub ticks: u64,
}

/// Parses one task's stat line. The name sits in parentheses and may itself hold spaces and
/// parentheses, so the fields start after the LAST `)`.
pub fn parse_stat(tid: i32, line: &str) -> Option<TaskStat> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?.to_string();
    let mut rest = line.get(close + 1..)?.split_ascii_whitespace();
    let state = rest.next()?.chars().next()?;
    // After the state (field 3): ppid … utime is field 14, stime field 15.
    let mut rest = rest.skip(10);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some(TaskStat {
        tid,
        comm,
        state,
        ticks: utime + stime,
    })
}

/// Reads this process's task list. Each thread's stat file stays open and is read again from
/// offset 0 (the kernel writes it afresh), so a refresh costs a directory listing and one read a
/// thread, not an open and a close as well.
#[derive(Default)]
pub struct TaskReader {
    /// The process read: None for this one (`/proc/self`), else an attached process's pid.
    pid: Option<u32>,
    files: HashMap<i32, File>,
    tids: Vec<i32>,
    buf: Vec<u8>,
}

impl TaskReader {
    /// Every thread of this process now. A thread that exits while it is read is skipped.
    pub fn read(&mut self) -> std::io::Result<Vec<TaskStat>> {
        self.tids.clear();
        let proc = match self.pid {
            Some(pid) => format!("/proc/{pid}"),
            None => "/proc/self".to_string(),
        };
        for entry in std::fs::read_dir(format!("{proc}/task"))? {
            let Ok(entry) = entry else { continue };
            if let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) {
                self.tids.push(tid);
            }
        }
        self.tids.sort_unstable();
        let tids = &self.tids;
        self.files.retain(|tid, _| tids.binary_search(tid).is_ok());
        self.buf.resize(4096, 0);
        let mut out = Vec::with_capacity(self.tids.len());
        for &tid in &self.tids {
            let file = match self.files.entry(tid) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => match File::open(format!("{proc}/task/{tid}/stat")) {
                    Ok(f) => v.insert(f),
                    Err(_) => continue,
                },
            };
            let Ok(n) = file.read_at(&mut self.buf, 0) else {
                continue;
            };
            let line = std::str::from_utf8(&self.buf[..n]).ok();
            if let Some(t) = line.and_then(|l| parse_stat(tid, l)) {
                out.push(t);
            }
        }
        Ok(out)
    }
}

/// Memory through sysinfo, refreshed for this pid and /proc/meminfo only.
struct MemoryProbe {
    sys: System,
    pid: Pid,
}

impl MemoryProbe {
    fn new(pid: u32) -> Self {
        MemoryProbe {
            sys: System::new(),
            pid: Pid::from_u32(pid),
        }
    }

    fn sample(&mut self) -> Option<MemorySample> {
        self.sys.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[self.pid]),
            false,
            ProcessRefreshKind::nothing().with_memory(),
        );
        self.sys
            .refresh_memory_specifics(MemoryRefreshKind::nothing().with_ram());
        let rss = self.sys.process(self.pid)?.memory();
        Some(MemorySample {
            rss_mib: rss >> 20,
            host_used_mib: self.sys.used_memory() >> 20,
            host_total_mib: self.sys.total_memory() >> 20,
        })
    }
}

/// Memory is read every this many samples (every 2 s at the hub's rate): it moves slowly, and
/// sysinfo's read of it costs about as much as the whole task list.
const MEMORY_EVERY: u64 = 4;

pub struct CpuProbe {
    tasks: TaskReader,
    prev: HashMap<i32, u64>,
    prev_at: Option<Instant>,
    ticks_per_s: f64,
    memory: MemoryProbe,
    last_memory: Option<MemorySample>,
    samples: u64,
    /// The last read of /proc/self/task failed (hidden or unreadable /proc).
    unreadable: bool,
}

impl Default for CpuProbe {
    fn default() -> Self {
        Self::new()
    }
}

/// Clock ticks per second of utime/stime (USER_HZ, 100 on Linux).
fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as f64
    } else {
        100.0
    }
}

impl CpuProbe {
    /// Reads this process.
    pub fn new() -> Self {
        Self::of(None)
    }

    /// Reads process `pid` (an attached trainer or Python pipeline), or this one for None.
    pub fn of(pid: Option<u32>) -> Self {
        CpuProbe {
            tasks: TaskReader {
                pid,
                ..TaskReader::default()
            },
            prev: HashMap::new(),
            prev_at: None,
            ticks_per_s: ticks_per_s(),
            memory: MemoryProbe::new(pid.unwrap_or_else(std::process::id)),
            last_memory: None,
            samples: 0,
            unreadable: false,
        }
    }

    /// Reads every thread's CPU time and state. Percentages are over the time since the previous
    /// call; the first call only primes the counters and returns None, as does a failed read.
    pub fn sample_threads(&mut self) -> Option<HashMap<i32, ThreadCpu>> {
        let now = Instant::now();
        let read = self.tasks.read();
        self.unreadable = read.is_err();
        let tasks = read.ok()?;
        let prev_at = self.prev_at.replace(now);
        let prev = std::mem::take(&mut self.prev);
        self.prev = tasks.iter().map(|t| (t.tid, t.ticks)).collect();
        let secs = now.duration_since(prev_at?).as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let scale = 100.0 / (self.ticks_per_s * secs);
        Some(
            tasks
                .into_iter()
                .map(|t| {
                    // A thread born since the last sample spent all its ticks within it.
                    let used = t
                        .ticks
                        .saturating_sub(prev.get(&t.tid).copied().unwrap_or(0));
                    let cpu = ThreadCpu {
                        tid: t.tid,
                        name: t.comm,
                        cpu_pct: (used as f64 * scale) as f32,
                        state: t.state,
                    };
                    (t.tid, cpu)
                })
                .collect(),
        )
    }

    /// Threads and memory (read every `MEMORY_EVERY` samples, the last value in between); None
    /// on the priming call (see `sample_threads`).
    /// Why there are no figures, when the last read of this process's task list failed: /proc
    /// hidden or unreadable (a locked-down container).
    pub fn unavailable(&self) -> Option<&'static str> {
        self.unreadable
            .then_some("per-thread CPU: n/a (the process's /proc task list is unreadable)")
    }

    pub fn sample(&mut self) -> Option<CpuSample> {
        let threads = self.sample_threads()?;
        if self.samples.is_multiple_of(MEMORY_EVERY) {
            self.last_memory = self.memory.sample();
        }
        self.samples += 1;
        Some(CpuSample {
            threads,
            memory: self.last_memory,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    use std::time::Duration;

    /// A named thread that reports its tid, then spins (or sleeps, parked: it wakes only when
    /// unparked, so a sample cannot catch it between naps waiting for a CPU) until told to stop.
    fn named(name: &str, spin: bool, stop: Arc<AtomicBool>) -> (i32, std::thread::JoinHandle<()>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                tx.send(crate::probe::current_tid()).unwrap();
                let mut x = 0u64;
                while !stop.load(Relaxed) {
                    if spin {
                        x = x.wrapping_add(std::hint::black_box(1));
                    } else {
                        std::thread::park_timeout(Duration::from_secs(10));
                    }
                }
                std::hint::black_box(x);
            })
            .unwrap();
        (rx.recv().unwrap(), h)
    }

    #[test]
    fn a_spinning_thread_runs_and_a_sleeping_one_sleeps() {
        let stop = Arc::new(AtomicBool::new(false));
        let (spin_tid, spin) = named("cpu-probe-spin", true, stop.clone());
        let (sleep_tid, sleep) = named("cpu-probe-nap", false, stop.clone());
        let mut probe = CpuProbe::new();
        assert!(probe.sample().is_none(), "the first sample only primes");
        std::thread::sleep(Duration::from_millis(400));
        let s = probe.sample().expect("second sample has data");
        stop.store(true, Relaxed);
        sleep.thread().unpark();
        spin.join().unwrap();
        sleep.join().unwrap();
        let t = &s.threads[&spin_tid];
        assert_eq!(t.name, "cpu-probe-spin");
        assert!(
            t.cpu_pct > 20.0,
            "a spinning thread used {}% CPU",
            t.cpu_pct
        );
        assert_eq!(t.state, 'R', "a spinning thread is running");
        let n = &s.threads[&sleep_tid];
        assert_eq!(n.name, "cpu-probe-nap");
        assert_eq!(n.state, 'S', "a parked thread is sleeping");
        assert!(
            n.cpu_pct < 20.0,
            "a sleeping thread used {}% CPU",
            n.cpu_pct
        );
        let main = crate::probe::current_tid();
        assert!(
            s.threads.contains_key(&main),
            "the calling thread is listed"
        );
        let m = s.memory.expect("sysinfo reads this process's memory");
        assert!(m.rss_mib > 0 && m.host_total_mib >= m.rss_mib, "{m:?}");
        // Joined threads leave the list (the kernel may take a moment to release them).
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            let now = probe.sample_threads().expect("later samples have data");
            !now.contains_key(&spin_tid) && !now.contains_key(&sleep_tid)
        });
        assert!(gone, "exited threads are still listed");
        assert!(
            !probe.tasks.files.contains_key(&spin_tid),
            "the stat file of an exited thread is closed"
        );
    }

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "4242 (pt_autograd_0) S 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0 1 0 99";
        let t = parse_stat(4242, line).unwrap();
        assert_eq!(
            (t.comm.as_str(), t.state, t.ticks),
            ("pt_autograd_0", 'S', 175)
        );
        let odd = "7 (a) b (c) R 1 2 3 4 5 6 7 8 9 10 3 4 0";
        let t = parse_stat(7, odd).unwrap();
        assert_eq!((t.comm.as_str(), t.state, t.ticks), ("a) b (c", 'R', 7));
        assert!(parse_stat(1, "1 (x) R 1 2").is_none());
    }
}
