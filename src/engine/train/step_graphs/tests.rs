//! Tests of the drafter step's CUDA graphs (src/engine/train/step_graphs.rs): which kept plan a step runs through.

use super::*;

fn plan(windows: &[(i64, i64)]) -> WindowPlan {
    WindowPlan(
        windows
            .iter()
            .enumerate()
            .map(|(i, &(start, len))| [4 * i as i64, 4, start, len])
            .collect(),
    )
}

/// A plan with a graph runs through it; a new one gets a graph while there is room; after
/// that, through the kept plan of fewest keys among those that cover it, or eagerly where
/// none does.
#[test]
fn a_step_takes_its_own_plan_then_a_new_graph_then_the_cheapest_cover() {
    let a = plan(&[(0, 1024), (0, 1536), (1024, 1536)]);
    let b = plan(&[(0, 1024), (0, 2048), (512, 2560)]);
    let c = plan(&[(0, 1024), (0, 2048), (0, 3072)]);
    let needed = plan(&[(0, 512), (0, 1536), (1024, 1536)]);
    let kept = |index, own| PlanChoice::Kept { index, own };
    assert_eq!(choose_plan(&[&a, &b], &a, 0), kept(0, true));
    assert_eq!(choose_plan(&[&a], &needed, 1), PlanChoice::Capture);
    // a, b and c all cover it; b and c hold more keys than a.
    assert_eq!(choose_plan(&[&c, &b, &a], &needed, 0), kept(2, false));
    // Only c holds run 2 of this one (from key 0).
    let early = plan(&[(0, 1024), (0, 1536), (0, 1536)]);
    assert_eq!(choose_plan(&[&a, &b, &c], &early, 0), kept(2, false));
    // None holds a run 0 past key 1024; nor a plan of other runs.
    let late = plan(&[(0, 1536), (0, 1536), (1024, 1536)]);
    assert_eq!(choose_plan(&[&a, &b, &c], &late, 0), PlanChoice::Eager);
    let two_runs = plan(&[(0, 1024), (0, 1536)]);
    assert_eq!(choose_plan(&[&c], &two_runs, 0), PlanChoice::Eager);
}

/// A run that sees no context is held by any window of the same tiles.
#[test]
fn an_empty_window_is_covered_by_any() {
    let empty = plan(&[(0, 0), (0, 1024)]);
    let some = plan(&[(512, 512), (0, 1024)]);
    assert!(some.covers(&empty) && !empty.covers(&some));
}
