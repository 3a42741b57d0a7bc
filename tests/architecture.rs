//! The layout's floors (docs/architecture.md), written once and checked over every file of src/: a room
//! (a top-level module) may use its own files and the rooms of lower floors, never a room of its
//! own floor or above, and the viewers never reach the engine. Checked transitively: a path
//! through any file counts, and a failure names the whole chain.
//!
//! Test code (`#[cfg(test)]` modules, inline or in a file of their own declared `#[cfg(test)]
//! mod tests;`) may build its inputs from higher floors (a resolved config, say) and is left out.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// Floors, lowest first; each line one floor, its rooms side by side.
const FLOORS: &[&[&str]] = &[
    // ground: no knowledge of anything else
    &[
        "cancel",
        "quiet_panic",
        "fault",
        "progress",
        "scratch",
        "save_layout",
        "cuda_shim",
        "job",
    ],
    // the first signal stops like `q`, a second removes the scratch paths and exits
    &["signals"],
    &["probe"],
    &["telemetry"],
    &["engine", "wire", "summary", "fail_if"],
    // flags + TOML -> the engine's spec; the viewers
    &["config", "tui", "headless"],
    // what the commands share: a training session, the TUI's loop
    &["cmd/session"],
    // train's TUI when a job's ranks share a terminal
    &["cmd/job_screen"],
    // the commands, one leaf each
    &[
        "cmd/train",
        "cmd/replay",
        "cmd/export",
        "cmd/attach",
        "cmd/bench",
        "cmd/doctor",
        "cmd/generate",
    ],
    // the dispatch
    &["cmd", "main", "lib"],
];

/// The engine's rooms (src/engine/<room>.rs and src/engine/<room>/), lowest first, by the same
/// rule: a room may use its own files and the rooms of lower floors. docs/architecture.md says
/// what each holds; src/engine.rs is the engine's root and no room.
const ENGINE_FLOORS: &[&[&str]] = &[
    // CUDA, CUPTI, fast paths, host syncs
    &["gpu"],
    // packing, JSONL, tokenizing, chat templates
    &["data"],
    // the target, the drafter, their shapes, weights, FLOPs
    &["model"],
    // blocks, recipe and presets, loss, optimizer, the drafter's step
    &["train"],
    &["checkpoint"],
    // the resolved run
    &["spec"],
    // replicas and multi-process jobs: the pipeline starts them
    &["parallel"],
    &["pipeline"],
    &["bench"],
];

/// Rooms that must not reach another even where the floors would allow it, with the reason.
const NEVER: &[(&str, &str, &str)] = &[(
    "tui",
    "engine",
    "the viewer reads snapshots; it asks the engine through a HubCommand",
)];

fn floor_of(room: &str) -> Option<usize> {
    FLOORS.iter().position(|f| f.contains(&room))
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's module path under the crate: src/telemetry/queue.rs -> [telemetry, queue].
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap().with_extension("");
    rel.iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect()
}

/// The room a file belongs to (src/lib.rs and src/main.rs are rooms of their own; each command
/// under src/cmd/ is one).
fn room_of(file: &Path) -> String {
    let m = module_of(file);
    match &m[..] {
        [cmd, sub, ..] if cmd == "cmd" => format!("cmd/{sub}"),
        _ => m[0].clone(),
    }
}

/// The file that holds module `path` (the longest prefix that is a file).
fn file_of(path: &[String]) -> Option<PathBuf> {
    (1..=path.len()).rev().find_map(|n| {
        let base = path[..n].iter().fold(src(), |p, s| p.join(s));
        [base.with_extension("rs"), base.join("mod.rs")]
            .into_iter()
            .find(|f| f.is_file())
    })
}

/// The source without comments, string literals and test modules.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .map(|l| {
            // Drop what sits between quotes: a message may spell a path.
            let mut out = String::new();
            let mut quoted = false;
            for c in l.chars() {
                if c == '"' {
                    quoted = !quoted;
                } else if !quoted {
                    out.push(c);
                }
            }
            out
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The module paths a file's code names from `crate::` or `super::` (`use` lists included), as
/// absolute paths.
fn paths_named(file: &Path, code: &str) -> Vec<Vec<String>> {
    let here = module_of(file);
    // A file's `super` is its parent module; a mod.rs-less module file (a.rs beside a/) is
    // itself the parent of a/*.rs.
    let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    for (anchor, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code;
        while let Some(i) = rest.find(anchor) {
            let before = rest[..i].chars().last();
            rest = &rest[i + anchor.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let mut starts = Vec::new();
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                starts.extend(group[..end].split(',').map(|s| s.trim().to_string()));
            } else {
                starts.push(rest.to_string());
            }
            for s in starts {
                let mut path = base.clone();
                for seg in s.split("::") {
                    let id = ident(seg.trim());
                    if id.is_empty() || id == "self" {
                        break;
                    }
                    path.push(id);
                    if !seg.trim().chars().all(|c| c.is_alphanumeric() || c == '_') {
                        break;
                    }
                }
                if !path.is_empty() {
                    out.push(path);
                }
            }
        }
    }
    out
}

/// The files of test modules declared `#[cfg(test)]\nmod NAME;` by `file`: NAME.rs in the
/// directory of `file`'s submodules.
fn test_module_files(file: &Path, text: &str) -> Vec<PathBuf> {
    let own_dir = match file.file_name().and_then(|n| n.to_str()) {
        Some("mod.rs" | "lib.rs" | "main.rs") => file.parent().unwrap().to_path_buf(),
        _ => file.with_extension(""),
    };
    text.split("#[cfg(test)]\nmod ")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split(';').next()?;
            let plain = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
            plain.then(|| own_dir.join(format!("{name}.rs")))
        })
        .collect()
}

/// Each file of src/ (test modules' files left out) and the files its code uses.
fn graph() -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let tests: BTreeSet<PathBuf> = files
        .iter()
        .flat_map(|f| test_module_files(f, &std::fs::read_to_string(f).unwrap()))
        .collect();
    files.retain(|f| !tests.contains(f));
    files
        .iter()
        .map(|f| {
            let code = code_of(&std::fs::read_to_string(f).unwrap());
            let used = paths_named(f, &code)
                .iter()
                .filter_map(|p| file_of(p))
                .filter(|u| u != f && !tests.contains(u))
                .collect();
            (f.clone(), used)
        })
        .collect()
}

/// Why `from` may not use `to`, or None where it may.
fn forbidden(from: &str, to: &str) -> Option<String> {
    if from == to {
        return None;
    }
    if let Some((_, _, why)) = NEVER.iter().find(|(a, b, _)| *a == from && *b == to) {
        return Some(format!("{from} never uses {to}: {why}"));
    }
    let (f, t) = (floor_of(from)?, floor_of(to)?);
    (t >= f)
        .then(|| format!("{from} (floor {f}) may use only lower floors, and {to} is on floor {t}"))
}

fn chain(path: &[PathBuf]) -> String {
    path.iter()
        .map(|p| p.strip_prefix(src()).unwrap().display().to_string())
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// The engine room a file of src/engine/ belongs to (None for src/engine.rs and files outside).
fn engine_room_of(file: &Path) -> Option<String> {
    match &module_of(file)[..] {
        [engine, room, ..] if engine == "engine" => Some(room.clone()),
        _ => None,
    }
}

/// Why engine room `from` may not use engine room `to`, or None where it may.
fn engine_forbidden(from: &str, to: &str) -> Option<String> {
    let floor = |r: &str| ENGINE_FLOORS.iter().position(|f| f.contains(&r));
    let (f, t) = (floor(from)?, floor(to)?);
    (from != to && t >= f).then(|| {
        format!("engine/{from} (engine floor {f}) may use only lower floors, and engine/{to} is on floor {t}")
    })
}

/// Every path from a room's files that ends in a room it may not use: the shortest chain each.
fn violations(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<String> {
    chains(graph, |f| Some(room_of(f)), forbidden)
}

/// `violations` inside the engine, over its rooms' floors (files outside the engine not walked).
fn engine_violations(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<String> {
    chains(graph, engine_room_of, engine_forbidden)
}

/// Every path from a file with a room (`room`) that ends in a room `forbid` keeps it from: the
/// shortest chain each; files with no room are not walked.
fn chains(
    graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    room: impl Fn(&Path) -> Option<String>,
    forbid: impl Fn(&str, &str) -> Option<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for start in graph.keys() {
        let Some(from) = room(start) else {
            continue;
        };
        let mut seen: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        let mut todo = VecDeque::from([start.clone()]);
        while let Some(f) = todo.pop_front() {
            for next in &graph[&f] {
                if next == start || seen.contains_key(next) {
                    continue;
                }
                let Some(to) = room(next) else {
                    continue;
                };
                seen.insert(next.clone(), f.clone());
                if let Some(why) = forbid(&from, &to) {
                    let mut path = vec![next.clone()];
                    let mut at = next.clone();
                    while let Some(prev) = seen.get(&at).filter(|p| *p != start) {
                        path.push(prev.clone());
                        at = prev.clone();
                    }
                    path.push(start.clone());
                    path.reverse();
                    found.push(format!("{}: {why}", chain(&path)));
                    // A forbidden room is not walked through: its own uses are its own report.
                    continue;
                }
                todo.push_back(next.clone());
            }
        }
    }
    found
}

#[test]
fn every_room_of_src_is_on_a_floor() {
    let rooms: BTreeSet<String> = graph().keys().map(|f| room_of(f)).collect();
    let homeless: Vec<_> = rooms.iter().filter(|r| floor_of(r).is_none()).collect();
    assert!(
        homeless.is_empty(),
        "rooms on no floor of tests/architecture.rs: {homeless:?}; give each its floor"
    );
}

#[test]
fn no_file_reaches_a_floor_above_its_own_or_the_engine_from_the_viewer() {
    let g = graph();
    // The reader finds what it should: a few known uses, so a parser that saw nothing fails.
    let uses = |from: &str, to: &str| g[&src().join(from)].contains(&src().join(to));
    assert!(uses("engine/pipeline.rs", "engine/spec.rs"));
    assert!(uses("telemetry/host.rs", "telemetry/owner.rs"));
    assert!(uses("tui/panels/gpus.rs", "telemetry/placement.rs"));
    assert!(uses("cmd/session.rs", "engine/pipeline.rs"));
    assert!(uses("cmd/train.rs", "cmd/session.rs"));
    // A test module's own file is test code: it may reach up, and is not in the graph.
    assert!(!g.contains_key(&src().join("engine/train/step/tests.rs")));
    assert!(g.contains_key(&src().join("engine/train/step.rs")));
    let bad = violations(&g);
    assert!(
        bad.is_empty(),
        "uses that break the floors:\n{}",
        bad.join("\n")
    );
}

#[test]
fn a_use_that_reaches_up_through_another_file_is_caught_with_its_chain() {
    // The checker itself, on a made-up graph: tui/a.rs -> telemetry/t.rs is allowed, but the
    // chain on to engine/x.rs is reported twice: from telemetry (a floor above its own) and
    // from tui (the engine, reached through another room's file).
    let f = |p: &str| src().join(p);
    let g: BTreeMap<PathBuf, BTreeSet<PathBuf>> = [
        (f("tui/a.rs"), BTreeSet::from([f("telemetry/t.rs")])),
        (f("telemetry/t.rs"), BTreeSet::from([f("engine/x.rs")])),
        (f("engine/x.rs"), BTreeSet::new()),
    ]
    .into_iter()
    .collect();
    let bad = violations(&g);
    assert!(
        bad.iter()
            .any(|v| v
                .starts_with("tui/a.rs -> telemetry/t.rs -> engine/x.rs: tui never uses engine")),
        "{bad:?}"
    );
    assert!(
        bad.iter()
            .any(|v| v.starts_with("telemetry/t.rs -> engine/x.rs: telemetry (floor 3)")),
        "{bad:?}"
    );
}

#[test]
fn every_engine_room_is_on_an_engine_floor_and_none_reaches_up() {
    let g = graph();
    let rooms: BTreeSet<String> = g.keys().filter_map(|f| engine_room_of(f)).collect();
    assert!(
        rooms.contains("gpu") && rooms.contains("pipeline"),
        "{rooms:?}"
    );
    let homeless: Vec<_> = rooms
        .iter()
        .filter(|r| !ENGINE_FLOORS.iter().any(|f| f.contains(&r.as_str())))
        .collect();
    assert!(
        homeless.is_empty(),
        "engine rooms on no floor of tests/architecture.rs: {homeless:?}"
    );
    // The reader finds the engine's own uses across rooms.
    let uses = |from: &str, to: &str| g[&src().join(from)].contains(&src().join(to));
    assert!(uses("engine/pipeline.rs", "engine/train/step.rs"));
    assert!(uses("engine/train/step.rs", "engine/train/grad_mean.rs"));
    let bad = engine_violations(&g);
    assert!(
        bad.is_empty(),
        "uses that break the engine's floors:\n{}",
        bad.join("\n")
    );
}

#[test]
fn an_engine_room_that_reaches_up_is_caught_with_its_chain() {
    // A planted upward use: a model file reaching the pipeline through a train file.
    let f = |p: &str| src().join(p);
    let g: BTreeMap<PathBuf, BTreeSet<PathBuf>> = [
        (
            f("engine/model/m.rs"),
            BTreeSet::from([f("engine/train/t.rs")]),
        ),
        (
            f("engine/train/t.rs"),
            BTreeSet::from([f("engine/pipeline/p.rs")]),
        ),
        (
            f("engine/pipeline/p.rs"),
            BTreeSet::from([f("engine/gpu/g.rs")]),
        ),
        (f("engine/gpu/g.rs"), BTreeSet::new()),
    ]
    .into_iter()
    .collect();
    let bad = engine_violations(&g);
    assert!(
        bad.iter().any(|v| v
            .starts_with("engine/model/m.rs -> engine/train/t.rs: engine/model (engine floor 2)")),
        "{bad:?}"
    );
    assert!(
        bad.iter().any(|v| v.starts_with(
            "engine/train/t.rs -> engine/pipeline/p.rs: engine/train (engine floor 3)"
        )),
        "{bad:?}"
    );
    // Down is allowed: the pipeline's use of the GPU room is no report.
    assert!(
        !bad.iter().any(|v| v.starts_with("engine/pipeline/p.rs")),
        "{bad:?}"
    );
}
