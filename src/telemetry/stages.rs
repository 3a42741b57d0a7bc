//! Stage tables: the chain of stages a producer of telemetry declares (stage names in chain
//! order, the phases each one marks), so that a pipeline other than ours — a Python
//! `producer → queue → consumer` — gets named threads, phase bars and a verdict.
//!
//! Our own pipeline is the built-in table (loader → target → drafter, the `Role` and `Phase`
//! enums). A declared table is resolved into `Names`, a value the snapshots of its pipeline carry:
//! its stages become `Role::Stage(k)` and its phase names the built-in phase of that name or one
//! of the `Phase::Custom*` slots. Declared names win: a client's stage called `target` is its own
//! stage with its own phases, never our built-in target (a stream resolves its threads' stage
//! names against its own table: `StageTable::role_of`).

use super::names::StageNames;
use super::phase::{custom_phase, MAX_STAGES};
use super::phase::{Phase, Role, N_CUSTOM};
use serde::{Deserialize, Serialize};

use super::names::Names;

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

    /// Checks the table and makes its names: the declared stages become `Role::Stage(k)`, their
    /// phase names the built-in phase of that name or one of the `Phase::Custom*` slots. The
    /// built-in table's names are `Names::builtin()`. Returns the names and the role of each
    /// stage, in order.
    pub fn resolve(&self) -> Result<(Names, Vec<Role>), TableError> {
        if self.is_builtin() {
            return Ok((
                Names::builtin(),
                vec![Role::Loader, Role::Target, Role::Drafter],
            ));
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
        let mut stages = Vec::new();
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
                    None => custom_slot(&mut custom, name)?,
                };
                if p != Phase::Other && !list.contains(&p) {
                    list.push(p);
                }
            }
            list.push(Phase::Other);
            stages.push(StageNames {
                name: st.name.clone(),
                phases: list,
                counts_tokens: i + 1 == n,
                upstream: self.stages[i.saturating_sub(1)].name.clone(),
            });
        }
        let roles = (0..n).map(|k| Role::Stage(k as u8)).collect();
        Ok((Names::declared(stages, custom), roles))
    }

    /// The role of the stage called `name` in this table, given the roles `resolve` returned
    /// for it (None for a name the table does not declare).
    pub fn role_of(&self, roles: &[Role], name: &str) -> Option<Role> {
        let k = self.stages.iter().position(|s| s.name == name)?;
        roles.get(k).copied()
    }
}

/// The custom slot of a phase name not built in: the one it was given, else the next free one.
fn custom_slot(custom: &mut Vec<String>, name: &str) -> Result<Phase, TableError> {
    let slot = match custom.iter().position(|c| c == name) {
        Some(s) => s,
        None if custom.len() < N_CUSTOM => {
            custom.push(name.to_string());
            custom.len() - 1
        }
        None => return Err(TableError::TooManyPhases(name.to_string())),
    };
    Ok(custom_phase(slot))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::verdict::Verdict;

    #[test]
    fn a_declared_chain_gets_its_names_and_the_builtin_one_is_recognised() {
        let (builtin_names, builtin_roles) = StageTable::builtin().resolve().unwrap();
        assert_eq!(
            builtin_roles,
            vec![Role::Loader, Role::Target, Role::Drafter]
        );
        assert!(builtin_names.is_builtin());
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
        let (n, roles) = t.resolve().unwrap();
        assert_eq!(roles, vec![Role::Stage(0), Role::Stage(1)]);
        assert_eq!(n.role(Role::Stage(1)), "consumer");
        let names: Vec<_> = n
            .phases(Role::Stage(1))
            .iter()
            .map(|p| n.phase(*p))
            .collect();
        assert_eq!(names, ["pop_wait", "forward", "make", "other"]);
        assert!(n.is_wait(n.phases(Role::Stage(1))[0]));
        assert!(!n.is_wait(n.phases(Role::Stage(1))[2]));
        assert_eq!(
            n.phases(Role::Stage(0))[1],
            Phase::PushWait,
            "built-in names are reused"
        );
        assert!(n.counts_tokens(Role::Stage(1)) && !n.counts_tokens(Role::Stage(0)));
        assert_eq!(
            n.verdict(Verdict::Starved(1)),
            "consumer starved: producer-bound"
        );
        assert_eq!(n.role_named("producer"), Some(Role::Stage(0)));
        let dup = StageTable {
            stages: vec![t.stages[0].clone(), t.stages[0].clone()],
        };
        assert_eq!(
            dup.resolve(),
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
        let (n, roles) = dflash.resolve().unwrap();
        assert_eq!(roles, vec![Role::Stage(0), Role::Stage(1)]);
        assert_eq!(dflash.role_of(&roles, "target"), Some(Role::Stage(0)));
        assert_eq!(dflash.role_of(&roles, "loader"), None);
        assert_eq!(n.role_named("drafter"), Some(Role::Stage(1)));
        let names = |r: Role| -> Vec<&str> { n.phases(r).iter().map(|p| n.phase(*p)).collect() };
        assert_eq!(n.role(Role::Stage(0)), "target");
        assert_eq!(names(Role::Stage(0)), ["forward", "other"]);
        assert_eq!(n.role(Role::Stage(1)), "drafter");
        assert_eq!(
            names(Role::Stage(1)),
            ["anchors", "forward", "loss", "backward", "optim", "metrics", "other"]
        );
        // The built-in table's names are ours.
        let builtin = StageTable::builtin();
        let (n, roles) = builtin.resolve().unwrap();
        assert_eq!(n.role_named("target"), Some(Role::Target));
        assert_eq!(builtin.role_of(&roles, "drafter"), Some(Role::Drafter));
    }

    #[test]
    fn two_pipelines_names_live_side_by_side() {
        let one = |stage: &str, phase: &str| StageTable {
            stages: vec![
                StageDecl {
                    name: "source".into(),
                    phases: vec![phase.into()],
                },
                StageDecl {
                    name: stage.into(),
                    phases: vec!["pop_wait".into(), phase.into()],
                },
            ],
        };
        let (a, _) = one("decode", "parse").resolve().unwrap();
        let (b, _) = one("train", "step").resolve().unwrap();
        let builtin = Names::builtin();
        // The same stage and slot, named by each pipeline's own names.
        let slot = a.phases(Role::Stage(0))[0];
        assert_eq!(slot, b.phases(Role::Stage(0))[0]);
        assert_eq!((a.phase(slot), b.phase(slot)), ("parse", "step"));
        assert_eq!(builtin.phase(slot), "phase0");
        assert_eq!(a.role(Role::Stage(1)), "decode");
        assert_eq!(b.role(Role::Stage(1)), "train");
        assert_eq!(builtin.role(Role::Stage(1)), "stage1");
        assert_eq!(a.verdict_short(Verdict::Blocked(1)), "decode-bound");
        assert_eq!(b.verdict_short(Verdict::Blocked(1)), "train-bound");
        assert_eq!(builtin.verdict_short(Verdict::Blocked(1)), "blocked");
        assert_eq!(b.role_named("decode"), None);
        assert_eq!(builtin.role_named("target"), Some(Role::Target));
    }
}
