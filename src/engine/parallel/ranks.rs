//! One process of a torchrun-style job (`RANK`, `WORLD_SIZE`, ... in src/job.rs): each process
//! trains the same number of drafter replicas (one per `--drafter-devices` entry), and the
//! replicas of all processes average their gradients. Replica `d` of rank `r` is the job's
//! replica `r * per_rank + d` in the collectives.
//!
//! - The rendezvous: every rank joins libtorch's `c10d::TCPStore` at MASTER_ADDR:MASTER_PORT
//!   (rank 0 hosts it, or torchrun's agent does) and writes what its run is — the fields of its
//!   `config:` line and a hash of its data (`agreement`). Before any collective, each rank
//!   compares every rank's fields with rank 0's; a difference is one sentence naming the rank and
//!   the field, on every rank.
//! - The step gate and the gradients of this process's replica: src/engine/parallel/rank_replica.rs.
//! - The watch: a heartbeat per rank in the store, twice a second. A rank that reports a failure,
//!   or whose heartbeat stops for `LOST_AFTER`, stops every other rank with a sentence naming
//!   it; if this process has not ended `EXIT_GRACE` later (a worker held in a collective), it
//!   exits as after a second signal.

use super::c10d::JobStore;
use crate::cancel::CancelToken;
use crate::engine::spec::ProcessHooks;
use crate::job::JobTag;
use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod agreement;
mod watch;
pub(crate) use agreement::join_job;
pub use agreement::{file_digest, first_mismatch};

/// A rank whose heartbeat has not moved for this long is taken as gone.
pub const LOST_AFTER: Duration = Duration::from_secs(5);
/// How often each rank beats and looks at the others.
const BEAT: Duration = Duration::from_millis(250);
/// After a fault, how long the process may take to end by itself before it exits.
pub const EXIT_GRACE: Duration = Duration::from_secs(10);
/// A collective that waits longer than this for a peer fails (the watch names the peer first).
pub(super) const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a rank waits for the others to join its job.
const JOIN_WAIT: Duration = Duration::from_secs(300);

/// This process's link to the other ranks of its job.
pub struct JobLink {
    pub tag: JobTag,
    /// Drafter replicas each process trains (every rank agrees on it at the rendezvous).
    pub per_rank: usize,
    /// The process's signals (a first one gives up the rendezvous; the forced exit).
    hooks: ProcessHooks,
    /// The gate, the exchanges, the ends (quick requests only).
    pub(super) store: Arc<JobStore>,
    /// The watch's own connection: libtorch's client serializes requests, and a process
    /// group's rendezvous blocks on its connection until the peer comes; the heartbeat must not
    /// wait behind it.
    beat: JobStore,
    /// The first fault seen: a rank that failed or went silent.
    fault: Mutex<Option<String>>,
    /// Set when this process ends: the watch stops, silence of others is no longer a fault.
    ending: AtomicBool,
}

fn job_prefix(tag: &JobTag) -> String {
    format!("dflash-top/{}/", tag.id)
}

/// Another connection to the job's store (rank 0 included: a client of its own server).
pub(super) fn connect_client(tag: &JobTag, timeout: Duration) -> Result<JobStore, String> {
    JobStore::connect(
        &tag.master_addr,
        tag.master_port,
        false,
        tag.world,
        timeout,
        &job_prefix(tag),
    )
}

/// A request to the job's store failed: on a rank that is its client, the host is gone (the
/// first of the rank's threads to notice says it, in the watch's words); on rank 0, its own
/// store failed.
pub(super) fn store_err(tag: &JobTag, what: &str, e: String) -> anyhow::Error {
    if tag.rank != 0 || tag.agent_store {
        return anyhow!("{}", store_gone(tag, &format!("{what}: {e}")));
    }
    anyhow!(
        "rank 0 of the job at {}:{}: {what}: {e}",
        tag.master_addr,
        tag.master_port
    )
}

/// The sentence for a store that stopped answering.
fn store_gone(tag: &JobTag, detail: &str) -> String {
    let host = match tag.agent_store {
        true => "torchrun's agent",
        false => "rank 0",
    };
    format!(
        "{host}, which hosts the job's rendezvous at {}:{}, is gone ({detail}): rank {} stops",
        tag.master_addr, tag.master_port, tag.rank
    )
}

impl JobLink {
    /// Joins the job with `per_rank` replicas: connects to its store, publishes `fields`, waits
    /// up to `wait` for every rank to do the same, and checks that they all agree with rank 0.
    pub fn join(
        tag: &JobTag,
        per_rank: usize,
        fields: &[(String, String)],
        wait: Duration,
        hooks: ProcessHooks,
    ) -> Result<Arc<JobLink>> {
        let host_it = tag.rank == 0 && !tag.agent_store;
        let prefix = job_prefix(tag);
        let store = JobStore::connect(
            &tag.master_addr,
            tag.master_port,
            host_it,
            tag.world,
            wait,
            &prefix,
        )
        .map_err(|e| match host_it {
            true => anyhow!(
                "rank 0 cannot host the job's rendezvous on port {} (MASTER_PORT): {e}: choose a free port",
                tag.master_port
            ),
            false => anyhow!(
                "rank {} cannot reach the job's rendezvous at {}:{} (MASTER_ADDR:MASTER_PORT) within {} s: {e}: start rank 0 with the same MASTER_ADDR and MASTER_PORT",
                tag.rank,
                tag.master_addr,
                tag.master_port,
                wait.as_secs()
            ),
        })?;
        let beat = connect_client(tag, wait)
            .map_err(|e| store_err(tag, "opening the watch's connection", e))?;
        let link = Arc::new(JobLink {
            tag: tag.clone(),
            per_rank,
            hooks,
            store: Arc::new(store),
            beat,
            fault: Mutex::new(None),
            ending: AtomicBool::new(false),
        });
        let mine: BTreeMap<String, String> = fields.iter().cloned().collect();
        let text = serde_json::to_vec(&mine)?;
        link.store
            .set(&format!("check/{}", tag.rank), &text)
            .map_err(|e| store_err(tag, "publishing its config", e))?;
        let all = link.gather_checks(wait)?;
        let verdict = all
            .iter()
            .enumerate()
            .skip(1)
            .find_map(|(rank, theirs)| first_mismatch(rank as u32, &all[0], theirs));
        // Rank 0 hosts the store: it stays until every rank has read the others' config.
        let _ = link.exchange("checked", b"", &CancelToken::new(), Duration::from_secs(5));
        match verdict {
            Some(why) => bail!("{why}"),
            None => Ok(link),
        }
    }

    /// The job's drafter replicas, over every rank.
    pub fn replicas(&self) -> usize {
        self.tag.world as usize * self.per_rank
    }

    /// The job's index of this process's replica `d`.
    pub fn replica_index(&self, d: usize) -> usize {
        self.tag.rank as usize * self.per_rank + d
    }

    /// Every rank's `value` under `name` (an all-gather through the store), in rank order;
    /// waits up to `wait` for the last rank, or until the run stops.
    pub fn exchange(
        &self,
        name: &str,
        value: &[u8],
        cancel: &CancelToken,
        wait: Duration,
    ) -> Result<Vec<Vec<u8>>> {
        self.publish(name, value)?;
        self.gather(name, cancel, wait)
    }

    /// This rank's `value` under `name`, for the others to `gather`.
    pub fn publish(&self, name: &str, value: &[u8]) -> Result<()> {
        let tag = &self.tag;
        self.store
            .set(&format!("{name}/{}", tag.rank), value)
            .map_err(|e| store_err(tag, "publishing to the others", e))
    }

    /// Sets `key` in the job's store (one key for every rank to read, e.g. a host's).
    pub fn write(&self, key: &str, value: &[u8]) -> Result<()> {
        self.store
            .set(key, value)
            .map_err(|e| store_err(&self.tag, "writing to the job's store", e))
    }

    /// `key`'s value in the job's store, if set (an error: the store is gone).
    pub fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.store
            .try_get(key)
            .map_err(|e| store_err(&self.tag, "reading the job's store", e))
    }

    /// Rank `rank`'s value under `name`, if it has published one (an error: the store is gone).
    pub fn published(&self, name: &str, rank: u32) -> Result<Option<Vec<u8>>> {
        self.store
            .try_get(&format!("{name}/{rank}"))
            .map_err(|e| store_err(&self.tag, "reading what the others published", e))
    }

    /// Every rank's value under `name`, in rank order, once each has published it; waits up to
    /// `wait` for the last rank, or until the run stops.
    pub fn gather(&self, name: &str, cancel: &CancelToken, wait: Duration) -> Result<Vec<Vec<u8>>> {
        let tag = &self.tag;
        let deadline = Instant::now() + wait;
        let mut got: Vec<Option<Vec<u8>>> = vec![None; tag.world as usize];
        let all = self.poll(cancel, || {
            for (r, slot) in got.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                *slot = self.store.try_get(&format!("{name}/{r}"))?;
            }
            if got.iter().all(Option::is_some) {
                return Ok(Some(got.iter().flatten().cloned().collect::<Vec<_>>()));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not every rank published `{name}` within {} s",
                    wait.as_secs()
                ));
            }
            Ok(None)
        })?;
        all.ok_or_else(|| anyhow!("stopped while waiting for the other ranks"))
    }

    /// Every rank's published fields, waiting up to `wait` for the last.
    fn gather_checks(&self, wait: Duration) -> Result<Vec<BTreeMap<String, String>>> {
        let tag = &self.tag;
        let deadline = Instant::now() + wait;
        let mut got: Vec<Option<BTreeMap<String, String>>> = vec![None; tag.world as usize];
        loop {
            for (r, slot) in got.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                if let Some(v) = self
                    .store
                    .try_get(&format!("check/{r}"))
                    .map_err(|e| store_err(tag, "reading the others' config", e))?
                {
                    *slot = Some(serde_json::from_slice(&v)?);
                }
            }
            if got.iter().all(Option::is_some) {
                return Ok(got.into_iter().flatten().collect());
            }
            if Instant::now() >= deadline || (self.hooks.stop_requested)() {
                let missing: Vec<String> = got
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                bail!(
                    "rank(s) {} of WORLD_SIZE={} did not join the job at {}:{} within {} s: start every rank with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE",
                    missing.join(", "),
                    tag.world,
                    tag.master_addr,
                    tag.master_port,
                    wait.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `done` until it says the round is over; None if the run stopped or a rank is lost
    /// first.
    pub(super) fn poll<T>(
        &self,
        cancel: &CancelToken,
        mut done: impl FnMut() -> Result<Option<T>, String>,
    ) -> Result<Option<T>> {
        let mut pause = Duration::from_micros(100);
        loop {
            if let Some(v) = done().map_err(|e| store_err(&self.tag, "meeting the others", e))? {
                return Ok(Some(v));
            }
            if cancel.is_cancelled() || self.fault().is_some() {
                return Ok(None);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::parallel::c10d::free_port;
    use crate::engine::parallel::rank_replica::JobGate;
    use crate::engine::parallel::replicas::{Arrival, StepMeet};

    fn tag(rank: u32, world: u32, port: u16) -> JobTag {
        JobTag {
            id: format!("test-{port}"),
            rank,
            world,
            local_rank: rank,
            host: "here".into(),
            master_addr: "127.0.0.1".into(),
            master_port: port,
            agent_store: false,
        }
    }

    /// `world` ranks as threads of this process, each joined to a real store, running `body`.
    fn ranks<T: Send>(world: u32, body: impl Fn(Arc<JobLink>) -> T + Sync) -> Vec<T> {
        ranks_of(world, 1, body)
    }

    /// `ranks` with `per_rank` replicas each.
    fn ranks_of<T: Send>(
        world: u32,
        per_rank: usize,
        body: impl Fn(Arc<JobLink>) -> T + Sync,
    ) -> Vec<T> {
        let port = free_port();
        let fields = vec![("seed".to_string(), "1".to_string())];
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .map(|r| {
                    let (body, fields) = (&body, &fields);
                    s.spawn(move || {
                        let hooks = ProcessHooks {
                            stop_requested: || false,
                            exit_now: |_, why| panic!("{why}"),
                        };
                        let wait = Duration::from_secs(30);
                        let link =
                            JobLink::join(&tag(r, world, port), per_rank, fields, wait, hooks)
                                .unwrap();
                        let out = body(link.clone());
                        link.finish(&Ok(()));
                        out
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn ranks_pass_the_gate_together_skip_together_or_all_stop() {
        use Arrival::*;
        let rounds = [[Go, Go, Go], [Go, Skip, Go], [Skip, Stop, Go], [Go, Go, Go]];
        let seen = ranks(3, |link| {
            let gate = JobGate::new(link.clone(), CancelToken::new(), 0);
            rounds
                .iter()
                .map(|r| gate.pass(r[link.tag.rank as usize]))
                .collect::<Vec<_>>()
        });
        for (rank, outcomes) in seen.iter().enumerate() {
            assert_eq!(
                outcomes,
                &vec![Go, Skip, Stop, Go],
                "rank {rank}: the most severe arrival of each round"
            );
        }
    }

    #[test]
    fn the_replicas_of_every_rank_pass_the_gate_together() {
        use Arrival::*;
        // Two ranks of two replicas: the job's replica 3 (rank 1's second) skips round 1 and
        // stops round 2; each replica's gate counts its own rounds.
        let arrival = |replica: usize, round: usize| match (replica, round) {
            (3, 1) => Skip,
            (3, 2) => Stop,
            _ => Go,
        };
        let seen = ranks_of(2, 2, |link| {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|d| {
                        let link = link.clone();
                        s.spawn(move || {
                            let gate = JobGate::new(link.clone(), CancelToken::new(), d);
                            let me = link.replica_index(d);
                            (0..3)
                                .map(|g| gate.pass(arrival(me, g)))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap())
                    .collect::<Vec<_>>()
            })
        });
        assert_eq!(seen.len(), 2);
        for (rank, replicas) in seen.iter().enumerate() {
            for (d, outcomes) in replicas.iter().enumerate() {
                assert_eq!(outcomes, &vec![Go, Skip, Stop], "rank {rank} replica {d}");
            }
        }
    }

    #[test]
    fn an_exchange_gives_every_rank_every_value_in_rank_order() {
        let seen = ranks(3, |link| {
            let mine = [link.tag.rank as u8 * 10];
            link.exchange("x", &mine, &CancelToken::new(), Duration::from_secs(30))
                .unwrap()
        });
        for got in seen {
            assert_eq!(got, vec![vec![0u8], vec![10], vec![20]]);
        }
    }
}
