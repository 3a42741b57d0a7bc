//! The drafter's step through CUDA graphs. At 0.6B shapes the drafter's host launches its
//! kernels more slowly than the GPU runs them when the drafter has a GPU of its own (its stream
//! sat idle 3–27% of the step, depending on the host): about 30 small kernels a layer in the
//! forward and twice that in backward. Two graphs take them over: the forward (from the batch's
//! tensors, anchors included, to the drafter's output and the labels) and the backward through
//! the drafter. The phases between them stay eager and keep their marks: the loss (its rows
//! vary per batch), the clip and the optimizer (few kernels; the learning rate changes per step).
//!
//! A graph replays fixed shapes and addresses, and the attention's shapes follow from the
//! step's window plan (`WindowPlan`: the runs of tiles and their context windows, planned per
//! batch on the host). So graphs are kept per plan, up to `MAX_PLANS`, in one memory pool (a
//! step replays one plan's forward and backward before any other graph runs). A batch whose
//! plan has no graph runs through the cheapest kept plan that covers it (wider windows, the same
//! visible keys), or a new graph while there is room, or else eagerly. All graphs read one set of
//! input tensors, with the anchors padded to the first batch's width; a batch of another shape
//! runs eagerly. The first steps run eagerly (kernels loaded, allocator warm).

use super::blocks::Anchors;
use crate::engine::gpu::cuda::Graph;
use crate::engine::gpu::fast_paths::PathState;
use crate::engine::model::tiled::WindowPlan;
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use tch::Tensor;

/// Eager steps of the graphs' shape before the first capture.
pub const WARM_STEPS: u32 = 2;

/// Window plans given graphs of their own, at most (the rest run through one that covers them).
pub const MAX_PLANS: usize = 16;

/// Graphs only where the device's peak allocation after the warm-up is at most this share of its
/// memory: the graphs' pool keeps about a step's activations of its own, and a batch that fills
/// the GPU gains nothing from fewer launches anyway.
pub const MEMORY_SHARE: f64 = 0.5;

/// How the drafter steps ran in this process.
static STATE: PathState = PathState::untried();
/// Graphed steps through their own plan's graph, through a covering plan's, and steps of the
/// graphs' shape that ran eagerly because no kept plan covered them.
static OWN_PLAN: AtomicU64 = AtomicU64::new(0);
static COVERING_PLAN: AtomicU64 = AtomicU64::new(0);
static UNCOVERED: AtomicU64 = AtomicU64::new(0);
/// Set where a replica left the graphs off for want of memory (see `MEMORY_SHARE`).
static NO_ROOM: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// "eager", "eager (failed: …)", or "graph" with the share of steps through their own plan's
/// graph, a covering one, and eagerly (no kept plan covers it, or a wider batch).
pub fn state() -> String {
    let described = STATE.describe("graph", "eager");
    if !described.starts_with("graph") {
        if NO_ROOM.load(Ordering::Relaxed) {
            let share = MEMORY_SHARE * 100.0;
            return format!("{described} (peak memory over {share:.0}% of the GPU's)");
        }
        return described;
    }
    let counts = [&OWN_PLAN, &COVERING_PLAN, &UNCOVERED].map(|c| c.load(Ordering::Relaxed));
    let total = counts.iter().sum::<u64>().max(1) as f64;
    let pct = |n: u64| 100.0 * n as f64 / total;
    format!(
        "{described}(own_plan={:.0}%,covering_plan={:.0}%,eager={:.0}%)",
        pct(counts[0]),
        pct(counts[1]),
        pct(counts[2])
    )
}

/// The device tensors a step's forward reads: the batch's, its hidden states and its anchors.
pub struct StepInputs {
    /// [b, s, n*h]
    pub hidden: Tensor,
    /// [b, s] each: token ids, positions, document ids, loss mask
    pub ids: Tensor,
    pub pos: Tensor,
    pub docs: Tensor,
    pub loss_mask: Tensor,
    pub anchors: Anchors,
}

impl StepInputs {
    fn tensors(&self) -> [&Tensor; 7] {
        [
            &self.hidden,
            &self.ids,
            &self.pos,
            &self.docs,
            &self.loss_mask,
            &self.anchors.pos,
            &self.anchors.valid,
        ]
    }

    /// Copies of every tensor (the graphs' own inputs).
    fn copy(&self) -> StepInputs {
        StepInputs {
            hidden: self.hidden.copy(),
            ids: self.ids.copy(),
            pos: self.pos.copy(),
            docs: self.docs.copy(),
            loss_mask: self.loss_mask.copy(),
            anchors: Anchors {
                pos: self.anchors.pos.copy(),
                valid: self.anchors.valid.copy(),
                count: self.anchors.count,
            },
        }
    }

    /// Whether `other` has this step's shapes and dtypes tensor by tensor.
    fn same_shapes(&self, other: &StepInputs) -> bool {
        self.tensors()
            .iter()
            .zip(other.tensors())
            .all(|(a, b)| a.size() == b.size() && a.kind() == b.kind() && a.device() == b.device())
    }
}

/// What the forward leaves for the loss and the metrics.
pub struct Forwarded {
    /// [b, a*block, h]: the drafter's output
    pub out: Tensor,
    /// [b, a, block]: the labels and where they count
    pub labels: Tensor,
    pub valid: Tensor,
}

impl Forwarded {
    fn shallow_clone(&self) -> Forwarded {
        Forwarded {
            out: self.out.shallow_clone(),
            labels: self.labels.shallow_clone(),
            valid: self.valid.shallow_clone(),
        }
    }
}

/// Which graph a step of plan `needed` runs through, given the plans that have graphs and room
/// for `room` more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanChoice {
    /// The graph of this plan (its own, or the cheapest one that covers it).
    Kept { index: usize, own: bool },
    /// A new graph for the plan.
    Capture,
    /// No graph: the step runs eagerly.
    Eager,
}

/// The choice for a step of plan `needed` among the `kept` plans (see `PlanChoice`).
pub fn choose_plan(kept: &[&WindowPlan], needed: &WindowPlan, room: usize) -> PlanChoice {
    if let Some(index) = kept.iter().position(|p| *p == needed) {
        return PlanChoice::Kept { index, own: true };
    }
    if room > 0 {
        return PlanChoice::Capture;
    }
    kept.iter()
        .enumerate()
        .filter(|(_, p)| p.covers(needed))
        .min_by_key(|(_, p)| p.keys())
        .map_or(PlanChoice::Eager, |(index, _)| PlanChoice::Kept {
            index,
            own: false,
        })
}

/// Whether `device`'s peak allocation so far leaves room for graphs (see `MEMORY_SHARE`).
fn room_for_graphs(device: tch::Device) -> bool {
    let tch::Device::Cuda(i) = device else {
        return false;
    };
    match (
        crate::cuda_shim::memory_peak(i, false),
        crate::cuda_shim::memory_total(i),
    ) {
        (Ok(peak), Ok(total)) => peak as f64 <= MEMORY_SHARE * total as f64,
        _ => false,
    }
}

/// A drafter replica's graphs and the shape they are kept for.
pub struct StepGraphs {
    wanted: bool,
    max_plans: usize,
    /// (rows, seq, anchor width) of the first batch that could run graphed.
    shape: Option<(i64, i64, usize)>,
    eager_steps: u32,
    /// What every plan's graph reads: the inputs, and the loss's gradient with respect to the
    /// output (copied in each step).
    inputs: Option<StepInputs>,
    grad: Option<Tensor>,
    plans: Vec<PlanGraph>,
    /// The plan whose forward ran last (its backward comes next).
    current: Option<usize>,
    /// Steps after the warm-up through their own plan's graph, a covering plan's, and eagerly.
    runs: [u64; 3],
}

struct PlanGraph {
    plan: WindowPlan,
    fwd: Forwarded,
    forward: Graph,
    backward: Graph,
}

impl StepGraphs {
    /// Graphs unless turned off: `--disable drafter-graph` (for side-by-side measurements), or
    /// `--disable graphs`, which turns every graph off.
    pub fn as_installed() -> StepGraphs {
        let on = crate::engine::gpu::fast_paths::on(
            crate::engine::gpu::fast_paths::FastPath::DrafterGraph,
        );
        StepGraphs::with(on && crate::engine::gpu::cuda::graphs_wanted(), MAX_PLANS)
    }

    /// Graphs wherever the step can run them, for up to `max_plans` window plans.
    pub fn on(max_plans: usize) -> StepGraphs {
        StepGraphs::with(crate::cuda_shim::AVAILABLE, max_plans)
    }

    /// Never graphs: every step eager.
    pub fn off() -> StepGraphs {
        StepGraphs::with(false, 0)
    }

    fn with(wanted: bool, max_plans: usize) -> StepGraphs {
        StepGraphs {
            wanted,
            max_plans,
            shape: None,
            eager_steps: 0,
            inputs: None,
            grad: None,
            plans: Vec::new(),
            current: None,
            runs: [0; 3],
        }
    }

    /// Whether a step was captured (and replayed).
    pub fn captured(&self) -> bool {
        !self.plans.is_empty()
    }

    /// Window plans with graphs of their own.
    pub fn plans(&self) -> usize {
        self.plans.len()
    }

    /// Steps after the warm-up through their own plan's graph, through a covering plan's, and
    /// eagerly (no kept plan covers theirs, or a batch wider than the graphs').
    pub fn runs(&self) -> [u64; 3] {
        self.runs
    }

    fn count(&mut self, way: usize) {
        self.runs[way] += 1;
        [&OWN_PLAN, &COVERING_PLAN, &UNCOVERED][way].fetch_add(1, Ordering::Relaxed);
    }

    /// The anchor width a step of `rows` x `seq` tokens, whose fullest row needs `width`
    /// anchors, runs graphed with; `None`: it runs eagerly (graphs off or failed, warming up,
    /// or another shape). `usable`: on a CUDA device, on a stream of the thread's own, with no
    /// replica to reduce gradients with during backward.
    pub fn graph_width(
        &mut self,
        (usable, device): (bool, tch::Device),
        rows: i64,
        seq: i64,
        width: usize,
    ) -> Option<usize> {
        if !self.wanted || !usable {
            return None;
        }
        let (r, s, w) = *self.shape.get_or_insert((rows, seq, width));
        if (r, s) != (rows, seq) || width > w {
            self.count(2);
            return None;
        }
        if self.eager_steps < WARM_STEPS {
            self.eager_steps += 1;
            return None;
        }
        if self.plans.is_empty() && !room_for_graphs(device) {
            NO_ROOM.store(true, Ordering::Relaxed);
            self.wanted = false;
            return None;
        }
        Some(w)
    }

    /// The forward of `x`, planned as `plan`, through a graph (see `PlanChoice`; a new one
    /// records `forward` with the plan it is given): the outputs are the graph's own tensors,
    /// written again by its next replay. `Ok(None)`: no graph for the plan, run the step
    /// eagerly. An error: a capture failed, and no graph is used from now on.
    pub fn forward(
        &mut self,
        x: &StepInputs,
        plan: &WindowPlan,
        forward: impl FnOnce(&StepInputs, &WindowPlan) -> Forwarded,
    ) -> Result<Option<Forwarded>> {
        let result = self.replay_forward(x, plan, forward);
        if let Err(e) = &result {
            self.give_up(e);
        }
        result
    }

    fn replay_forward(
        &mut self,
        x: &StepInputs,
        plan: &WindowPlan,
        forward: impl FnOnce(&StepInputs, &WindowPlan) -> Forwarded,
    ) -> Result<Option<Forwarded>> {
        self.current = None;
        let kept: Vec<&WindowPlan> = self.plans.iter().map(|g| &g.plan).collect();
        let room = self.max_plans.saturating_sub(kept.len());
        let choice = choose_plan(&kept, plan, room);
        let index = match choice {
            PlanChoice::Eager => {
                self.count(2);
                return Ok(None);
            }
            PlanChoice::Kept { index, own } => {
                self.count(if own { 0 } else { 1 });
                self.write_inputs(x)?;
                index
            }
            PlanChoice::Capture => {
                self.count(0);
                self.write_inputs(x)?;
                self.capture(plan, forward)?
            }
        };
        let g = &self.plans[index];
        g.forward.replay()?;
        self.current = Some(index);
        Ok(Some(g.fwd.shallow_clone()))
    }

    /// `x` into the graphs' inputs (made at the first graphed step, as copies of its tensors).
    fn write_inputs(&mut self, x: &StepInputs) -> Result<()> {
        let Some(inputs) = &self.inputs else {
            self.inputs = Some(x.copy());
            return Ok(());
        };
        anyhow::ensure!(
            inputs.same_shapes(x),
            "the step's tensors are not the graphs' shapes"
        );
        // Writing them bumps their autograd versions; nothing reads those (a capture's backward
        // follows its forward with no write between, and replays check nothing).
        for (into, from) in inputs.tensors().into_iter().zip(x.tensors()) {
            let mut into = into.shallow_clone();
            into.copy_(from);
        }
        Ok(())
    }

    /// Records `forward` of the graphs' inputs under `plan`, and the backward through it from
    /// the graphs' loss gradient, in the graphs' shared pool; the plan's index among the kept
    /// ones.
    fn capture(
        &mut self,
        plan: &WindowPlan,
        forward: impl FnOnce(&StepInputs, &WindowPlan) -> Forwarded,
    ) -> Result<usize> {
        let inputs = self.inputs.as_ref().expect("written before");
        let device = inputs.hidden.device();
        let share = self.plans.first().map(|g| &g.forward);
        let (forward, fwd) = Graph::capture(device, share, || forward(inputs, plan))?;
        let share = share.unwrap_or(&forward);
        let grad = self
            .grad
            .get_or_insert_with(|| fwd.out.detach().zeros_like());
        let (backward, done) = Graph::capture(device, Some(share), || {
            super::loss::backward_from(&fwd.out, grad)
        })?;
        done?;
        STATE.ran();
        self.plans.push(PlanGraph {
            plan: plan.clone(),
            fwd,
            forward,
            backward,
        });
        Ok(self.plans.len() - 1)
    }

    /// Backward through the drafter from the output of the forward that ran last, with the
    /// loss's gradient `grad`.
    pub fn backward(&mut self, grad: &Tensor) -> Result<()> {
        let index = self
            .current
            .take()
            .ok_or_else(|| anyhow::anyhow!("no forward graph to run backward through"))?;
        let static_grad = self.grad.as_ref().expect("made with the first graph");
        static_grad.shallow_clone().copy_(grad);
        self.plans[index].backward.replay()
    }

    fn give_up(&mut self, why: &anyhow::Error) {
        self.wanted = false;
        self.plans.clear();
        self.inputs = None;
        self.grad = None;
        self.current = None;
        STATE.failed(why);
    }
}

#[cfg(test)]
mod tests;
