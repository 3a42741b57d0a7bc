//! The engine's fast paths as one typed setting: each can be turned off for a side-by-side run
//! (`--disable graphs,fused-adamw`, or `[fast_paths] disable = [...]` in the TOML) and the
//! choice shows in the `config:` line and in recordings. A pipeline installs its setting when it
//! starts; the places that take a path ask `fast_paths::on`, and keep a `PathState` of whether
//! it ran.

use anyhow::{bail, Result};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering::Relaxed};

mod path_state;
pub use path_state::PathState;

/// A path the engine takes where it can, with a plainer one beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastPath {
    /// CUDA graphs: the target's forward and the drafter's step recorded once, replayed.
    Graphs,
    /// The drafter step's graphs alone (the target's stay).
    DrafterGraph,
    /// Our fused kernels in the target's forward (norm + RoPE, silu x up, add + RMSNorm).
    TargetKernels,
    /// AdamW in one fused kernel over the flat parameters.
    FusedAdamw,
    /// The drafter's weights and gradients in bf16 on a GPU, beside its f32 masters (off: f32
    /// weights cast to bf16 at each use, f32 gradients).
    Bf16Weights,
    /// Varlen flash attention in the target (off: one dense mask per row).
    FlashTarget,
    /// The drafter's attention in our own kernels over each block's visible keys only (off: the
    /// tiled sdpa calls).
    BlockAttention,
    /// Our kernels in the drafter's step: the q/k RMSNorm with RoPE, silu(gate) x up and each
    /// residual add with the RMSNorm after it, each one pass forward and one backward, and the
    /// loss over the logits in two passes (off: libtorch's ops, and their backward).
    DrafterKernels,
    /// A lone drafter replica's weight gradients added into their `.grad` by the GEMMs that make
    /// them, and an input's gradients from several projections summed the same way (off:
    /// autograd adds each after its GEMM).
    GemmGrads,
    /// Gradients all-reduced in buckets during backward (off: in one piece after it).
    GradSyncDuringBackward,
    /// One drafter replica skips the gradient average (off: even one GPU drafter goes through
    /// NCCL, world size 1, to exercise that path on a one-GPU machine).
    SingleReplicaShortcut,
}

/// Every path, its name in `--disable` and the TOML, and what turning it off means.
pub const ALL: [(FastPath, &str, &str); 11] = [
    (FastPath::Graphs, "graphs", "every CUDA graph off"),
    (
        FastPath::DrafterGraph,
        "drafter-graph",
        "the drafter step runs eagerly",
    ),
    (
        FastPath::TargetKernels,
        "target-kernels",
        "the target runs libtorch's ops",
    ),
    (FastPath::FusedAdamw, "fused-adamw", "AdamW as separate ops"),
    (
        FastPath::Bf16Weights,
        "bf16-weights",
        "the drafter's weights and gradients in f32 on a GPU",
    ),
    (
        FastPath::FlashTarget,
        "flash-target",
        "the target's attention with a dense mask",
    ),
    (
        FastPath::BlockAttention,
        "block-attention",
        "the drafter's attention as tiled sdpa calls",
    ),
    (
        FastPath::DrafterKernels,
        "drafter-kernels",
        "the drafter's q/k norm + RoPE, silu x up, add + norm and loss as libtorch's ops",
    ),
    (
        FastPath::GemmGrads,
        "gemm-grads",
        "the drafter's weight gradients added to .grad after their GEMMs",
    ),
    (
        FastPath::GradSyncDuringBackward,
        "grad-sync-during-backward",
        "gradients averaged after backward",
    ),
    (
        FastPath::SingleReplicaShortcut,
        "single-replica-shortcut",
        "one GPU drafter averages through NCCL",
    ),
];

/// Runs of tiles a layer in the drafter's tiled attention (1 is one window over all tiles); 0,
/// the default, picks by the batch's rows (`window_groups_for`).
pub const DEFAULT_WINDOW_GROUPS: i64 = 0;

/// Anchors a tile of the drafter's tiled attention holds at most (512 queries at block 16).
pub const DEFAULT_TILE_ANCHORS: i64 = 32;

/// The fast paths of a run: which are off, and the tiling knobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPaths {
    off: u32,
    pub window_groups: i64,
    pub tile_anchors: i64,
}

impl Default for FastPaths {
    fn default() -> FastPaths {
        FastPaths {
            off: 0,
            window_groups: DEFAULT_WINDOW_GROUPS,
            tile_anchors: DEFAULT_TILE_ANCHORS,
        }
    }
}

fn bit(p: FastPath) -> u32 {
    1 << ALL.iter().position(|(q, _, _)| *q == p).unwrap()
}

impl FastPaths {
    /// `names` turned off (`graphs`, `fused-adamw`, …); `what` names the flag or TOML key in
    /// the sentence for a name that is none of them.
    pub fn disabling<'a>(
        names: impl IntoIterator<Item = &'a str>,
        what: &str,
    ) -> Result<FastPaths> {
        let mut paths = FastPaths::default();
        for name in names.into_iter().map(str::trim).filter(|n| !n.is_empty()) {
            match ALL.iter().find(|(_, n, _)| *n == name) {
                Some((p, _, _)) => paths.off |= bit(*p),
                None => {
                    let known: Vec<&str> = ALL.iter().map(|(_, n, _)| *n).collect();
                    bail!(
                        "{what}: no fast path `{name}`; the names are {}",
                        known.join(", ")
                    )
                }
            }
        }
        Ok(paths)
    }

    pub fn is_on(&self, p: FastPath) -> bool {
        self.off & bit(p) == 0
    }

    /// `all` or the paths turned off (`-graphs,-fused-adamw`), then the window groups and the
    /// tile's anchors when not the default: for the `config:` line.
    pub fn describe(&self) -> String {
        let off: Vec<String> = ALL
            .iter()
            .filter(|(p, _, _)| !self.is_on(*p))
            .map(|(_, n, _)| format!("-{n}"))
            .collect();
        let mut s = if off.is_empty() {
            "all".to_string()
        } else {
            off.join(",")
        };
        if self.window_groups != DEFAULT_WINDOW_GROUPS {
            s.push_str(&format!(",window_groups={}", self.window_groups));
        }
        if self.tile_anchors != DEFAULT_TILE_ANCHORS {
            s.push_str(&format!(",tile_anchors={}", self.tile_anchors));
        }
        s
    }
}

static OFF: AtomicU32 = AtomicU32::new(0);
static WINDOW_GROUPS: AtomicI64 = AtomicI64::new(DEFAULT_WINDOW_GROUPS);
static TILE_ANCHORS: AtomicI64 = AtomicI64::new(DEFAULT_TILE_ANCHORS);

/// Makes `paths` the process's setting (a pipeline does, as it starts).
pub fn install(paths: FastPaths) {
    OFF.store(paths.off, Relaxed);
    WINDOW_GROUPS.store(paths.window_groups, Relaxed);
    TILE_ANCHORS.store(paths.tile_anchors, Relaxed);
}

/// Anchors a tile of the drafter's tiled attention holds at most, as installed (`tile_anchors`
/// under `[fast_paths]`, for side-by-side measurements; 32 by default).
pub fn tile_anchors() -> i64 {
    TILE_ANCHORS.load(Relaxed)
}

thread_local! {
    /// Paths the calling thread has turned off for a while (`without`), beside the process's.
    static OFF_HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether `p` may be taken in this process, on this thread.
pub fn on(p: FastPath) -> bool {
    (OFF.load(Relaxed) | OFF_HERE.with(|o| o.get())) & bit(p) == 0
}

/// `f` run with `p` off on the calling thread only (the process's setting and other threads
/// untouched): a side-by-side check of a path against the plain one inside one process.
pub fn without<T>(p: FastPath, f: impl FnOnce() -> T) -> T {
    for_a_while(&OFF_HERE, |off| off | bit(p), f)
}

/// `f` run with the calling thread's `setting` changed by `change`, and put back however `f`
/// ends (a panic a worker catches included).
pub fn for_a_while<C: Copy + 'static, T>(
    setting: &'static std::thread::LocalKey<std::cell::Cell<C>>,
    change: impl FnOnce(C) -> C,
    f: impl FnOnce() -> T,
) -> T {
    struct Restore<C: Copy + 'static>(&'static std::thread::LocalKey<std::cell::Cell<C>>, C);
    impl<C: Copy + 'static> Drop for Restore<C> {
        fn drop(&mut self) {
            self.0.with(|c| c.set(self.1));
        }
    }
    let before = setting.with(|c| {
        let before = c.get();
        c.set(change(before));
        before
    });
    let _restore = Restore(setting, before);
    f()
}

/// Runs of tiles a layer for a batch of `rows` rows: as installed, or by default 2 for one row
/// (its plans repeat: on an H200 at 0.6B every step replays its own plan's graphs, against 62%
/// with 4) and 4 for more (a plan is the union of the rows' windows: narrower runs pay there).
pub fn window_groups_for(rows: usize) -> i64 {
    groups_for(WINDOW_GROUPS.load(Relaxed), rows)
}

/// `window_groups_for` with the setting given.
fn groups_for(setting: i64, rows: usize) -> i64 {
    match setting {
        DEFAULT_WINDOW_GROUPS if rows <= 1 => 2,
        DEFAULT_WINDOW_GROUPS => 4,
        n => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `without` turns a path off for its closure on its thread only, and back on after.
    #[test]
    fn without_turns_a_path_off_on_this_thread_for_a_while() {
        assert!(on(FastPath::DrafterKernels));
        let inside = without(FastPath::DrafterKernels, || {
            let elsewhere = std::thread::Builder::new()
                .name("other".into())
                .spawn(|| on(FastPath::DrafterKernels))
                .unwrap()
                .join()
                .unwrap();
            (
                on(FastPath::DrafterKernels),
                on(FastPath::Graphs),
                elsewhere,
            )
        });
        assert_eq!(inside, (false, true, true));
        assert!(on(FastPath::DrafterKernels));
    }

    #[test]
    fn names_turn_paths_off_and_describe_says_which() {
        let all = FastPaths::default();
        assert!(ALL.iter().all(|(p, _, _)| all.is_on(*p)));
        assert_eq!(all.describe(), "all");
        let some = FastPaths::disabling(["graphs", " fused-adamw "], "--disable").unwrap();
        assert!(!some.is_on(FastPath::Graphs) && !some.is_on(FastPath::FusedAdamw));
        assert!(some.is_on(FastPath::TargetKernels));
        assert_eq!(some.describe(), "-graphs,-fused-adamw");
        let groups = FastPaths {
            window_groups: 1,
            ..FastPaths::default()
        };
        assert_eq!(groups.describe(), "all,window_groups=1");
        let tiles = FastPaths {
            tile_anchors: 16,
            ..FastPaths::default()
        };
        assert_eq!(tiles.describe(), "all,tile_anchors=16");
    }

    #[test]
    fn window_groups_follow_the_rows_unless_set() {
        let default = FastPaths::default().window_groups;
        assert_eq!((groups_for(default, 1), groups_for(default, 4)), (2, 4));
        assert_eq!((groups_for(8, 1), groups_for(8, 4)), (8, 8));
    }

    #[test]
    fn an_unknown_name_is_a_sentence_with_the_names() {
        let e = FastPaths::disabling(["graph"], "--disable")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--disable: no fast path `graph`"), "{e}");
        assert!(e.contains("graphs, drafter-graph"), "{e}");
    }
}
