//! What the ranks of a job must agree on before their first collective: the fields of each
//! rank's `config:` line (its drafter, recipe and data), the job's size, the step it resumes
//! from and its data file's digest, compared with rank 0's at the rendezvous (src/engine/parallel/ranks.rs).

use crate::engine::spec::{config_fields, DataSpec, PipelineSpec};
use anyhow::{anyhow, Result};
use std::collections::BTreeMap;
use std::sync::Arc;

use super::{JobLink, JOIN_WAIT};

/// Joins the job of `cfg.job` (this process trains a replica on each of its drafter devices):
/// the others must agree on the recipe (its `config:` line), the replicas a process, the data
/// and the step it resumes from.
pub(crate) fn join_job(cfg: &PipelineSpec, tag: &crate::job::JobTag) -> Result<Arc<JobLink>> {
    let mut fields = config_fields(&cfg.recipe_line());
    // How a rank measures (CUPTI there or not) is its own business, not the recipe's.
    fields.retain(|(k, _)| k != "cupti");
    fields.push(("world".into(), tag.world.to_string()));
    // The collectives number replica d of rank r as r * per_rank + d: every rank needs as many.
    let per_rank = cfg.drafter_devices.len();
    fields.push(("drafters_per_rank".into(), per_rank.to_string()));
    fields.push((
        "resume_step".into(),
        cfg.resume_state
            .as_ref()
            .map_or("none".into(), |s| s.step.to_string()),
    ));
    if let DataSpec::Jsonl(p) = &cfg.data {
        fields.push(("data_digest".into(), file_digest(p)?));
    }
    JobLink::join(tag, per_rank, &fields, JOIN_WAIT, cfg.hooks)
}

/// The first field in which `theirs` (rank `rank`'s) differs from rank 0's, as the sentence.
pub fn first_mismatch(
    rank: u32,
    rank0: &BTreeMap<String, String>,
    theirs: &BTreeMap<String, String>,
) -> Option<String> {
    let keys: std::collections::BTreeSet<&String> = rank0.keys().chain(theirs.keys()).collect();
    keys.into_iter().find_map(|k| {
        let (a, b) = (rank0.get(k), theirs.get(k));
        (a != b).then(|| {
            let show = |v: Option<&String>| v.map_or("(none)".to_string(), |s| s.clone());
            format!(
                "rank {rank} was started with {k}={} but rank 0 with {k}={}: every rank of a job \
                 must run the same drafter, recipe and data; start them with the same flags and files",
                show(b),
                show(a)
            )
        })
    })
}

/// A data file's identity for the rendezvous: its length and the CRC32 of its first and last
/// 4 MiB (cheap on a large file; two different files of one job differ there).
pub fn file_digest(path: &std::path::Path) -> Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    const PART: u64 = 4 << 20;
    let mut f = std::fs::File::open(path)
        .map_err(|e| anyhow!("--data {}: {e}: give a readable JSONL file", path.display()))?;
    let len = f.metadata()?.len();
    let mut crc = crc32fast::Hasher::new();
    let mut buf = Vec::new();
    (&mut f).take(PART).read_to_end(&mut buf)?;
    crc.update(&buf);
    if len > PART {
        buf.clear();
        f.seek(SeekFrom::Start(len.saturating_sub(PART).max(PART)))?;
        f.read_to_end(&mut buf)?;
        crc.update(&buf);
    }
    Ok(format!("{len}:{:08x}", crc.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_in_the_config_fields_names_rank_and_field() {
        let f = config_fields("config: recipe=preset:tiny lr=6e-4 data=/a b/c.jsonl seed=1");
        let a: BTreeMap<String, String> = f.iter().cloned().collect();
        assert_eq!(first_mismatch(1, &a, &a), None);
        let mut b = a.clone();
        b.insert("lr".into(), "1e-3".into());
        let why = first_mismatch(2, &a, &b).unwrap();
        assert!(
            why.starts_with("rank 2 was started with lr=1e-3 but rank 0 with lr=6e-4"),
            "{why}"
        );
        let mut b = a.clone();
        b.remove("seed");
        assert!(first_mismatch(1, &a, &b).unwrap().contains("seed=(none)"));
    }
}
