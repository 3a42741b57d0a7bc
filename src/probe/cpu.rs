//! Per-thread CPU of this process from /proc/self/task, through sysinfo.

use std::collections::HashMap;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};

/// One OS thread of this process as last sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct ThreadCpu {
    pub tid: i32,
    pub name: String,
    /// Percent of one core since the previous sample.
    pub cpu_pct: f32,
}

pub struct CpuProbe {
    sys: System,
    pid: Pid,
    primed: bool,
    /// A primed sample found no tasks of this process (/proc unreadable or hidden).
    unreadable: bool,
}

impl Default for CpuProbe {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuProbe {
    pub fn new() -> Self {
        CpuProbe {
            sys: System::new(),
            pid: Pid::from_u32(std::process::id()),
            primed: false,
            unreadable: false,
        }
    }

    /// Refreshes CPU times with tasks. Only a refresh of all processes makes sysinfo read each
    /// thread from /proc/PID/task/TID (a refresh by id reads /proc/TID, which on Linux reports
    /// the whole process), so that is what this does; it costs about a millisecond.
    fn refresh(&mut self) -> Vec<Pid> {
        let kind = ProcessRefreshKind::nothing()
            .with_cpu()
            .with_tasks()
            .with_exe(UpdateKind::Never);
        self.sys
            .refresh_processes_specifics(ProcessesToUpdate::All, true, kind);
        self.sys
            .process(self.pid)
            .and_then(|p| p.tasks())
            .map(|t| t.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Why there are no figures, when the last sample after priming found none of this
    /// process's threads: /proc/self/task unreadable (hidden /proc, a locked-down container).
    pub fn unavailable(&self) -> Option<&'static str> {
        self.unreadable
            .then_some("per-thread CPU: n/a (/proc/self/task is unreadable)")
    }

    /// Samples every thread. The first call only primes the counters and returns None.
    pub fn sample(&mut self) -> Option<HashMap<i32, ThreadCpu>> {
        let tasks = self.refresh();
        self.unreadable = self.primed && tasks.is_empty();
        if !self.primed {
            self.primed = true;
            return None;
        }
        let process = self.sys.process(self.pid)?;
        let total = process.cpu_usage();
        let main_name = process.name().to_string_lossy().into_owned();
        let mut out = HashMap::with_capacity(tasks.len());
        let mut others = 0.0;
        for tid in tasks.iter().filter(|t| **t != self.pid) {
            if let Some(t) = self.sys.process(*tid) {
                let tid = tid.as_u32() as i32;
                let name = t.name().to_string_lossy().into_owned();
                others += t.cpu_usage();
                out.insert(
                    tid,
                    ThreadCpu {
                        tid,
                        name,
                        cpu_pct: t.cpu_usage(),
                    },
                );
            }
        }
        let tid = self.pid.as_u32() as i32;
        out.insert(
            tid,
            ThreadCpu {
                tid,
                name: main_name,
                cpu_pct: (total - others).max(0.0),
            },
        );
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_busy_named_thread_shows_up_with_its_cpu() {
        let mut probe = CpuProbe::new();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::Builder::new()
            .name("cpu-probe-spin".into())
            .spawn(move || {
                tx.send(crate::telemetry::recorder::current_tid()).unwrap();
                let mut x = 0u64;
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    x = x.wrapping_add(std::hint::black_box(1));
                }
                x
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        // sysinfo starts counting a thread only once it has used some CPU time.
        std::thread::sleep(Duration::from_millis(100));
        probe.sample();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(300) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let threads = probe.sample().expect("second sample has data");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().unwrap();
        let spin = threads.get(&tid).expect("spinning thread listed");
        assert_eq!(spin.name, "cpu-probe-spin");
        assert!(
            spin.cpu_pct > 20.0,
            "a spinning thread used {}% CPU",
            spin.cpu_pct
        );
    }
}
