//! Stage tables: the chain of stages a producer of telemetry declares (stage names in chain
//! order, the phases each one marks), so that a pipeline other than ours — a Python
//! `producer → queue → consumer` — gets named threads, phase bars and a verdict.
//!
//! Our own pipeline is the built-in table (loader → target → drafter, the `Role` and `Phase`
//! enums). A declared table is installed once per process (a viewer watches one pipeline): its
//! stages become `Role::Stage(k)` and its phase names the built-in phase of that name or one of
//! the `Phase::Custom*` slots. Declared names win: a client's stage called `target` is its own
//! stage with its own phases, never our built-in target (a stream resolves its threads' stage
//! names against its own table: `StageTable::role_of`).

use super::phase::{Phase, Role, N_BUILTIN, N_CUSTOM};
use serde::{Deserialize, Serialize};
use std::sync::RwLock;

/// One stage as declared: its name and the phases its threads mark (in order; `other` implied).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageDecl {
    pub name: String,
    pub phases: Vec<String>,
}

/// The stages of a pipeline, upstream first. Queues join consecutive stages.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageTable {
    pub stages: Vec<StageDecl>,
}

/// Stages a table may declare (the verdict and the thread order index them with a byte).
pub const MAX_STAGES: usize = 16;

/// Why a declared table cannot be shown.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    #[error("the stage table declares no stage")]
    Empty,
    #[error("the stage table declares {0} stages; at most {MAX_STAGES} are shown")]
    TooManyStages(usize),
    #[error("stage {0:?} is declared twice in the stage table")]
    DuplicateStage(String),
    #[error("the stage table declares more than {N_CUSTOM} phase names of its own (beyond {0})")]
    TooManyPhases(String),
    #[error("a stage or phase name in the stage table is empty or longer than 32 bytes")]
    BadName,
}

/// What a declared table became: names leaked once, for the `&'static str` the views use.
struct Installed {
    stages: Vec<&'static str>,
    phases: Vec<&'static [Phase]>,
    custom: [&'static str; N_CUSTOM],
    starved: Vec<&'static str>,
    blocked: Vec<&'static str>,
    starved_short: Vec<&'static str>,
    blocked_short: Vec<&'static str>,
}

static INSTALLED: RwLock<Option<&'static Installed>> = RwLock::new(None);

fn installed() -> Option<&'static Installed> {
    *INSTALLED.read().unwrap_or_else(|e| e.into_inner())
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl StageTable {
    /// Our pipeline's table: loader → target → drafter with their phases.
    pub fn builtin() -> StageTable {
        let stage = |r: Role| StageDecl {
            name: r.name().to_string(),
            phases: r
                .phases()
                .iter()
                .filter(|p| **p != Phase::Other)
                .map(|p| p.name().to_string())
                .collect(),
        };
        StageTable {
            stages: vec![
                stage(Role::Loader),
                stage(Role::Target),
                stage(Role::Drafter),
            ],
        }
    }

    pub fn is_builtin(&self) -> bool {
        *self == StageTable::builtin()
    }

    /// Checks the table and makes it the one this process shows (the built-in table needs
    /// nothing). Returns the role of each stage, in order.
    pub fn install(&self) -> Result<Vec<Role>, TableError> {
        if self.is_builtin() {
            *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = None;
            return Ok(vec![Role::Loader, Role::Target, Role::Drafter]);
        }
        let n = self.stages.len();
        if n == 0 {
            return Err(TableError::Empty);
        }
        if n > MAX_STAGES {
            return Err(TableError::TooManyStages(n));
        }
        let ok = |s: &str| !s.is_empty() && s.len() <= 32;
        let mut custom: Vec<String> = Vec::new();
        let mut phases = Vec::new();
        for (i, st) in self.stages.iter().enumerate() {
            if !ok(&st.name) || !st.phases.iter().all(|p| ok(p)) {
                return Err(TableError::BadName);
            }
            if self.stages[..i].iter().any(|o| o.name == st.name) {
                return Err(TableError::DuplicateStage(st.name.clone()));
            }
            let mut list = Vec::new();
            for name in &st.phases {
                let p = match Phase::builtin(name) {
                    Some(p) => p,
                    None => {
                        let slot = match custom.iter().position(|c| c == name) {
                            Some(s) => s,
                            None if custom.len() < N_CUSTOM => {
                                custom.push(name.clone());
                                custom.len() - 1
                            }
                            None => return Err(TableError::TooManyPhases(name.clone())),
                        };
                        Phase::ALL[N_BUILTIN + slot]
                    }
                };
                if p != Phase::Other && !list.contains(&p) {
                    list.push(p);
                }
            }
            list.push(Phase::Other);
            phases.push(&*Box::leak(list.into_boxed_slice()));
        }
        let mut names = [""; N_CUSTOM];
        for (slot, name) in custom.into_iter().enumerate() {
            names[slot] = leak(name);
        }
        let stages: Vec<&'static str> = self.stages.iter().map(|s| leak(s.name.clone())).collect();
        // Texts by consumer stage k (the queue between k-1 and k).
        let pair = |k: usize| (stages[k.saturating_sub(1)], stages[k]);
        let starved = (0..n)
            .map(|k| {
                let (p, c) = pair(k);
                leak(format!("{c} starved: {p}-bound"))
            })
            .collect();
        let blocked = (0..n)
            .map(|k| {
                let (p, c) = pair(k);
                leak(format!("{p} blocked: {c}-bound"))
            })
            .collect();
        let starved_short = (0..n)
            .map(|k| leak(format!("{}-bound", pair(k).0)))
            .collect();
        let blocked_short = (0..n)
            .map(|k| leak(format!("{}-bound", pair(k).1)))
            .collect();
        let table = Installed {
            stages,
            phases,
            custom: names,
            starved,
            blocked,
            starved_short,
            blocked_short,
        };
        *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = Some(Box::leak(Box::new(table)));
        Ok((0..n).map(|k| Role::Stage(k as u8)).collect())
    }

    /// The role of the stage called `name` in this table, given the roles `install` returned
    /// for it (None for a name the table does not declare).
    pub fn role_of(&self, roles: &[Role], name: &str) -> Option<Role> {
        let k = self.stages.iter().position(|s| s.name == name)?;
        roles.get(k).copied()
    }
}

/// The name of declared slot `slot`, `phaseN` when no table names it.
pub fn custom_phase_name(slot: usize) -> &'static str {
    const FALLBACK: [&str; N_CUSTOM] = [
        "phase0", "phase1", "phase2", "phase3", "phase4", "phase5", "phase6", "phase7", "phase8",
        "phase9", "phase10", "phase11",
    ];
    installed()
        .map(|t| t.custom[slot.min(N_CUSTOM - 1)])
        .filter(|n| !n.is_empty())
        .unwrap_or(FALLBACK[slot.min(N_CUSTOM - 1)])
}

pub fn stage_name(k: usize) -> &'static str {
    installed()
        .and_then(|t| t.stages.get(k).copied())
        .unwrap_or("stage")
}

pub fn stage_phases(k: usize) -> &'static [Phase] {
    installed()
        .and_then(|t| t.phases.get(k).copied())
        .unwrap_or(&[Phase::Other])
}

pub fn is_last_stage(k: usize) -> bool {
    installed().is_some_and(|t| k + 1 == t.stages.len())
}

/// The stage of this name: a stage of the installed table first (declared names win, `target`
/// included), else a built-in role.
pub fn role_named(name: &str) -> Option<Role> {
    if let Some(k) = installed().and_then(|t| t.stages.iter().position(|s| *s == name)) {
        return Some(Role::Stage(k as u8));
    }
    match name {
        "loader" => Some(Role::Loader),
        "target" => Some(Role::Target),
        "drafter" => Some(Role::Drafter),
        _ => None,
    }
}

/// Verdict texts for declared stage `k` (`starved`: k waits on its input queue; else k-1 waits
/// on a full one): (long, short).
pub fn verdict_text(k: usize, starved: bool) -> (&'static str, &'static str) {
    let Some(t) = installed().filter(|t| k < t.stages.len()) else {
        return if starved {
            ("starved", "starved")
        } else {
            ("blocked", "blocked")
        };
    };
    if starved {
        (t.starved[k], t.starved_short[k])
    } else {
        (t.blocked[k], t.blocked_short[k])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declared_chain_gets_its_names_and_the_builtin_one_is_recognised() {
        assert_eq!(
            StageTable::builtin().install().unwrap(),
            vec![Role::Loader, Role::Target, Role::Drafter]
        );
        let t = StageTable {
            stages: vec![
                StageDecl {
                    name: "producer".into(),
                    phases: vec!["make".into(), "push_wait".into()],
                },
                StageDecl {
                    name: "consumer".into(),
                    phases: vec!["pop_wait".into(), "forward".into(), "make".into()],
                },
            ],
        };
        let roles = t.install().unwrap();
        assert_eq!(roles, vec![Role::Stage(0), Role::Stage(1)]);
        assert_eq!(Role::Stage(1).name(), "consumer");
        let names: Vec<_> = Role::Stage(1).phases().iter().map(|p| p.name()).collect();
        assert_eq!(names, ["pop_wait", "forward", "make", "other"]);
        assert!(Role::Stage(1).phases()[0].is_wait());
        assert!(!Role::Stage(1).phases()[2].is_wait());
        assert_eq!(
            Role::Stage(0).phases()[1],
            Phase::PushWait,
            "built-in names are reused"
        );
        assert!(Role::Stage(1).counts_tokens() && !Role::Stage(0).counts_tokens());
        assert_eq!(verdict_text(1, true).0, "consumer starved: producer-bound");
        assert_eq!(role_named("producer"), Some(Role::Stage(0)));
        let dup = StageTable {
            stages: vec![t.stages[0].clone(), t.stages[0].clone()],
        };
        assert_eq!(
            dup.install(),
            Err(TableError::DuplicateStage("producer".into()))
        );

        // Issue 26: stages named like ours keep their declared phases and names (the target's
        // first phase was drawn as our `batch_wait`, the drafter's optim as `grad_sync`).
        let decl = |name: &str, phases: &[&str]| StageDecl {
            name: name.into(),
            phases: phases.iter().map(|p| p.to_string()).collect(),
        };
        let dflash = StageTable {
            stages: vec![
                decl("target", &["forward"]),
                decl(
                    "drafter",
                    &["anchors", "forward", "loss", "backward", "optim", "metrics"],
                ),
            ],
        };
        let roles = dflash.install().unwrap();
        assert_eq!(roles, vec![Role::Stage(0), Role::Stage(1)]);
        assert_eq!(dflash.role_of(&roles, "target"), Some(Role::Stage(0)));
        assert_eq!(dflash.role_of(&roles, "loader"), None);
        assert_eq!(role_named("drafter"), Some(Role::Stage(1)));
        let names = |r: Role| -> Vec<&str> { r.phases().iter().map(|p| p.name()).collect() };
        assert_eq!(Role::Stage(0).name(), "target");
        assert_eq!(names(Role::Stage(0)), ["forward", "other"]);
        assert_eq!(Role::Stage(1).name(), "drafter");
        assert_eq!(
            names(Role::Stage(1)),
            ["anchors", "forward", "loss", "backward", "optim", "metrics", "other"]
        );
        // The built-in table installed again is ours again.
        let builtin = StageTable::builtin();
        let roles = builtin.install().unwrap();
        assert_eq!(role_named("target"), Some(Role::Target));
        assert_eq!(builtin.role_of(&roles, "drafter"), Some(Role::Drafter));
    }
}
