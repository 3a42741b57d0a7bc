//! Where this process sits in a torchrun-style job: the launcher's variables (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`, and torchrun's own
//! `TORCHELASTIC_RUN_ID` / `TORCHELASTIC_USE_AGENT_STORE`) read once into a `JobTag`. The engine
//! meets the other ranks with it; sessions carry it so that `attach --job` finds every rank.

use serde::{Deserialize, Serialize};

/// One process of a multi-process job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTag {
    /// The same on every rank of one job: torchrun's run id, else `MASTER_ADDR:MASTER_PORT`.
    pub id: String,
    pub rank: u32,
    pub world: u32,
    pub local_rank: u32,
    /// This host's name (GPUs are listed per host in the merged view).
    pub host: String,
    pub master_addr: String,
    pub master_port: u16,
    /// torchrun hosts the rendezvous store itself (its agent's store): every rank joins it as
    /// a client, rank 0 included.
    #[serde(default)]
    pub agent_store: bool,
}

impl JobTag {
    /// The job of this process, from its environment: None when `WORLD_SIZE` is unset or 1 with
    /// no `RANK` (a plain run). A malformed or inconsistent variable is a sentence naming it.
    pub fn from_env() -> Result<Option<JobTag>, String> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// `from_env` over any lookup (the tests give their own variables).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<JobTag>, String> {
        let number = |name: &str| -> Result<Option<u32>, String> {
            match var(name) {
                None => Ok(None),
                Some(v) => v.trim().parse::<u32>().map(Some).map_err(|_| {
                    format!("{name}={v:?} is not a whole number: set it as torchrun does (RANK=0..WORLD_SIZE-1)")
                }),
            }
        };
        let world = number("WORLD_SIZE")?;
        let rank = number("RANK")?;
        let (world, rank) = match (world, rank) {
            (None, None) => return Ok(None),
            (Some(1), None | Some(0)) => return Ok(None),
            (Some(w), Some(r)) => (w, r),
            (Some(_), None) => {
                return Err("WORLD_SIZE is set but RANK is not: set RANK for every process (0..WORLD_SIZE-1), or unset WORLD_SIZE for a single-process run".into())
            }
            (None, Some(_)) => {
                return Err("RANK is set but WORLD_SIZE is not: set WORLD_SIZE to the number of processes, or unset RANK for a single-process run".into())
            }
        };
        if world == 0 {
            return Err("WORLD_SIZE=0: it is the number of processes, at least 1".into());
        }
        if rank >= world {
            return Err(format!(
                "RANK={rank} is not below WORLD_SIZE={world}: ranks run from 0 to WORLD_SIZE-1"
            ));
        }
        let local_rank = number("LOCAL_RANK")?.unwrap_or(rank);
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        if master_addr.trim().is_empty() {
            return Err(
                "MASTER_ADDR is empty: give the host of rank 0 (127.0.0.1 on one machine)".into(),
            );
        }
        let master_port = match var("MASTER_PORT") {
            None => {
                return Err(format!(
                    "RANK={rank} WORLD_SIZE={world} but MASTER_PORT is not set: give every rank the same free port of rank 0's host (e.g. MASTER_PORT=29500)"
                ))
            }
            Some(p) => p.trim().parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                format!("MASTER_PORT={p:?} is not a port number (1-65535)")
            })?,
        };
        let id = var("TORCHELASTIC_RUN_ID")
            .filter(|s| !s.is_empty() && s != "none")
            .unwrap_or_else(|| format!("{master_addr}:{master_port}"));
        let agent_store = var("TORCHELASTIC_USE_AGENT_STORE").is_some_and(|v| v == "True");
        Ok(Some(JobTag {
            id,
            rank,
            world,
            local_rank,
            host: hostname(),
            master_addr,
            master_port,
            agent_store,
        }))
    }

    /// `rank=1/2`: the field every headless line of a rank carries.
    pub fn rank_field(&self) -> String {
        format!("rank={}/{}", self.rank, self.world)
    }

    /// ` job=ID rank=R/W local_rank=L`, the fields the `config:` line of a rank adds to its
    /// recipe, with ` replicas=A-B` (the job's replicas this rank trains) where it trains
    /// `per_rank` > 1.
    pub fn config_fields(&self, per_rank: usize) -> String {
        let mut out = format!(
            " job={} {} local_rank={}",
            self.id,
            self.rank_field(),
            self.local_rank
        );
        if per_rank > 1 {
            let first = self.rank as usize * per_rank;
            out.push_str(&format!(" replicas={first}-{}", first + per_rank - 1));
        }
        out
    }

    /// `r1`: how the merged views name this rank's threads and queues (`r1/drafter-0`).
    pub fn prefix(&self) -> String {
        format!("r{}", self.rank)
    }
}

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates when it fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tag(vars: &[(&str, &str)]) -> Result<Option<JobTag>, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        JobTag::from_vars(|k| map.get(k).cloned())
    }

    #[test]
    fn a_plain_run_has_no_job_and_torchruns_variables_make_one() {
        assert_eq!(tag(&[]).unwrap(), None);
        assert_eq!(tag(&[("WORLD_SIZE", "1")]).unwrap(), None);
        let t = tag(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((t.rank, t.world, t.local_rank), (1, 2, 1));
        assert_eq!(t.id, "10.0.0.5:29500", "no run id: the rendezvous address");
        assert!(!t.agent_store);
        assert_eq!(t.prefix(), "r1");
        assert_eq!(
            t.config_fields(1),
            " job=10.0.0.5:29500 rank=1/2 local_rank=1"
        );
        assert_eq!(
            t.config_fields(2),
            " job=10.0.0.5:29500 rank=1/2 local_rank=1 replicas=2-3",
            "rank 1's replicas of two a rank"
        );
        let t = tag(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(t.id, "abc", "torchrun's run id names the job");
        assert!(t.agent_store, "torchrun's agent hosts the store");
        assert_eq!(t.master_addr, "127.0.0.1");
    }

    #[test]
    fn a_bad_variable_is_a_sentence_naming_it() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK=\"x\""),
            (&[("RANK", "2"), ("WORLD_SIZE", "2")], "RANK=2 is not below"),
            (&[("WORLD_SIZE", "2")], "RANK is not"),
            (&[("RANK", "0")], "WORLD_SIZE is not"),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2")],
                "MASTER_PORT is not set",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")],
                "MASTER_PORT=\"70000\"",
            ),
        ];
        for (vars, want) in cases {
            let err = tag(vars).unwrap_err();
            assert!(err.contains(want), "{vars:?}: {err}");
        }
    }
}
