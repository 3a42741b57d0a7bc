//! The names of a pipeline as a value: each declared stage's name, phases and verdict texts, and
//! the names of the `Phase::Custom*` slots. A snapshot carries the names it was made with, so
//! that every front-end renders it with its own pipeline's words, and several pipelines can be
//! watched (and merged) in one process. `Names::builtin()` is our own loader → target → drafter;
//! `StageTable::resolve` makes the names of a declared table.

use super::phase::{Phase, Role};
use super::verdict::Verdict;
use serde::{Deserialize, Serialize};

/// One declared stage as resolved: `Role::Stage(k)` is the k-th of `Names::stages`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageNames {
    pub name: String,
    /// The phases its threads mark, in order, `other` last.
    pub phases: Vec<Phase>,
    /// Its steps carry the pipeline's tokens (the last stage of its chain).
    pub counts_tokens: bool,
    /// The stage before it in its chain, whose queue it pops (its own name for the first).
    pub upstream: String,
}

/// What names travel as (in snapshots written to a file): the verdict texts are made again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Declared {
    stages: Vec<StageNames>,
    custom: Vec<String>,
}

/// Verdict texts of one stage when it is the consumer of the queue judged.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Texts {
    starved: String,
    starved_short: String,
    blocked: String,
    blocked_short: String,
}

impl Texts {
    fn of(stage: &StageNames) -> Texts {
        let (p, c) = (&stage.upstream, &stage.name);
        Texts {
            starved: format!("{c} starved: {p}-bound"),
            starved_short: format!("{p}-bound"),
            blocked: format!("{p} blocked: {c}-bound"),
            blocked_short: format!("{c}-bound"),
        }
    }
}

/// A pipeline's names. Built-in roles and phases always have theirs; declared stages and custom
/// phase slots take them from here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Declared", into = "Declared")]
pub struct Names {
    declared: Declared,
    texts: Vec<Texts>,
}

impl From<Declared> for Names {
    fn from(declared: Declared) -> Names {
        let texts = declared.stages.iter().map(Texts::of).collect();
        Names { declared, texts }
    }
}

impl From<Names> for Declared {
    fn from(n: Names) -> Declared {
        n.declared
    }
}

impl Default for Names {
    fn default() -> Self {
        Names::builtin()
    }
}

impl Names {
    /// Our pipeline's names: loader → target → drafter, no declared stage or phase.
    pub fn builtin() -> Names {
        Names::from(Declared::default())
    }

    /// Names of declared stages (in chain order) and of the custom phase slots (by slot).
    pub fn declared(stages: Vec<StageNames>, custom: Vec<String>) -> Names {
        Names::from(Declared { stages, custom })
    }

    pub fn is_builtin(&self) -> bool {
        self.declared.stages.is_empty() && self.declared.custom.is_empty()
    }

    /// The declared stages, `Role::Stage(k)` the k-th.
    pub fn stages(&self) -> &[StageNames] {
        &self.declared.stages
    }

    /// The names of the custom phase slots in use, by slot.
    pub fn custom(&self) -> &[String] {
        &self.declared.custom
    }

    fn stage(&self, r: Role) -> Option<&StageNames> {
        match r {
            Role::Stage(k) => self.declared.stages.get(k as usize),
            _ => None,
        }
    }

    /// A phase's name: a custom slot's as declared (`phaseN` when none is), a built-in's own.
    pub fn phase(&self, p: Phase) -> &str {
        p.custom_slot()
            .and_then(|slot| self.declared.custom.get(slot))
            .map_or(p.name(), String::as_str)
    }

    /// A role's name: a declared stage's as declared (`stageN` when none is).
    pub fn role(&self, r: Role) -> &str {
        self.stage(r).map_or(r.name(), |s| s.name.as_str())
    }

    /// The phases `r` marks, in pipeline order, `other` last.
    pub fn phases(&self, r: Role) -> &[Phase] {
        self.stage(r).map_or(r.phases(), |s| s.phases.as_slice())
    }

    /// Whether `r`'s steps carry the pipeline's tokens (the last stage: drafters).
    pub fn counts_tokens(&self, r: Role) -> bool {
        self.stage(r).map_or(r.counts_tokens(), |s| s.counts_tokens)
    }

    /// Phases spent blocked on a queue rather than working: the built-in waits, and declared
    /// phases whose name ends in `_wait` (what the Python client's queue wrapper marks).
    pub fn is_wait(&self, p: Phase) -> bool {
        match p.custom_slot() {
            Some(_) => self.phase(p).ends_with("_wait"),
            None => p.is_wait(),
        }
    }

    /// The stage of this name: a declared stage first (declared names win, `target` included),
    /// else a built-in role.
    pub fn role_named(&self, name: &str) -> Option<Role> {
        if let Some(k) = self.declared.stages.iter().position(|s| s.name == name) {
            return Some(Role::Stage(k as u8));
        }
        match name {
            "loader" => Some(Role::Loader),
            "target" => Some(Role::Target),
            "drafter" => Some(Role::Drafter),
            _ => None,
        }
    }

    /// The verdict in words: "consumer starved: producer-bound".
    pub fn verdict(&self, v: Verdict) -> &str {
        match (v, self.texts_of(v)) {
            (Verdict::Starved(_), Some(t)) => &t.starved,
            (Verdict::Blocked(_), Some(t)) => &t.blocked,
            _ => v.text(),
        }
    }

    /// The verdict in a word or two: "producer-bound".
    pub fn verdict_short(&self, v: Verdict) -> &str {
        match (v, self.texts_of(v)) {
            (Verdict::Starved(_), Some(t)) => &t.starved_short,
            (Verdict::Blocked(_), Some(t)) => &t.blocked_short,
            _ => v.short(),
        }
    }

    fn texts_of(&self, v: Verdict) -> Option<&Texts> {
        match v {
            Verdict::Starved(k) | Verdict::Blocked(k) => self.texts.get(k as usize),
            _ => None,
        }
    }
}
