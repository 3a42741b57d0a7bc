//! What the CPU probe adds to a snapshot beside the workers' own rows: the threads no worker
//! registered, grouped under the worker that drives them; the process's memory; and, while there
//! is no sample, why.

use super::phase_recorder::ThreadInfo;
use super::snapshot::{MemoryView, ThreadGroupView};
use crate::probe::cpu::CpuSample;
use crate::telemetry::owner::{owner, Worker};
use std::collections::BTreeMap;

/// Threads no worker registered, grouped by name and by the worker that drives them
/// (libtorch's intra-op pool shares its creator's name; `pt_autograd_N` runs a drafter's
/// backward on cuda:N). Busiest group first.
pub fn groups(cpu: Option<&CpuSample>, threads: &[ThreadInfo]) -> Vec<ThreadGroupView> {
    let Some(cpu) = cpu else {
        return Vec::new();
    };
    let workers: Vec<Worker> = threads
        .iter()
        .map(|t| Worker {
            name: &t.name,
            role: t.role,
            device: &t.device,
        })
        .collect();
    let mut groups: BTreeMap<(Option<usize>, String), ThreadGroupView> = BTreeMap::new();
    for c in cpu.threads.values() {
        if threads.iter().any(|t| t.tid == c.tid) {
            continue;
        }
        let by = owner(&c.name, &workers);
        let g = groups
            .entry((by, c.name.clone()))
            .or_insert_with(|| ThreadGroupView {
                name: c.name.clone(),
                count: 0,
                cpu_pct: 0.0,
                owner: by.map(|i| threads[i].name.clone()),
                states: Vec::new(),
            });
        g.count += 1;
        g.cpu_pct += c.cpu_pct;
        match g.states.iter_mut().find(|(s, _)| *s == c.state) {
            Some((_, n)) => *n += 1,
            None => g.states.push((c.state, 1)),
        }
    }
    let mut v: Vec<_> = groups.into_values().collect();
    for g in &mut v {
        g.states.sort();
    }
    v.sort_by(|a, b| b.cpu_pct.total_cmp(&a.cpu_pct));
    v
}

/// The process's resident memory and the host's, when the probe read them.
pub fn memory(cpu: Option<&CpuSample>) -> Option<MemoryView> {
    let m = cpu?.memory?;
    Some(MemoryView {
        rss_mib: m.rss_mib,
        host_used_mib: m.host_used_mib,
        host_total_mib: m.host_total_mib,
    })
}

/// Why per-thread CPU is not shown: the probe's reason (`absent`), or that the first sample is
/// still to come. None once there is a sample.
pub fn cpu_note(cpu: Option<&CpuSample>, absent: Option<&str>) -> Option<String> {
    cpu.is_none()
        .then(|| absent.unwrap_or("per-thread CPU: sampling…").to_string())
}
