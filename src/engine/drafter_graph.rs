//! The drafter's step through CUDA graphs. At 0.6B shapes the drafter's host launches its
//! kernels more slowly than the GPU runs them (its stream sat idle 27% of the step on a GPU of
//! its own): about 30 small kernels a layer in the forward and twice that in backward. Two
//! graphs take them over: the forward (from the batch's tensors, anchors included, to the
//! drafter's output and the labels) and the backward through the drafter. The phases between
//! them stay eager and keep their marks: the loss (its rows vary per batch), the clip and the
//! optimizer (few kernels; the learning rate changes per step).
//!
//! A graph replays fixed shapes and fixed addresses, so a graphed step attends over the whole
//! context in every tile (`whole_context_block_mask`: the same visible set as the windows, which
//! are planned per batch) and pads its anchors to the width of the first batch. Its first steps
//! run eagerly the same way (kernels loaded, allocator warm), then the forward is captured, and
//! the backward at the first step after it. A batch of another shape runs eagerly, with windows.

use super::blocks::Anchors;
use super::cuda::{CaptureState, Graph};
use anyhow::Result;
use tch::Tensor;

/// Eager steps of the graph's shape before the capture.
pub const WARM_STEPS: u32 = 2;

/// How the drafter steps ran in this process.
static STATE: CaptureState = CaptureState::untried();

/// "graph", "eager (capture failed)" or "eager" (see `CaptureState`).
pub fn state() -> &'static str {
    STATE.describe()
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

    /// Copies of every tensor (the graph's own inputs).
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

/// How one step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepMode {
    /// Eagerly, attention over each run of tiles' window (planned per batch).
    Windows,
    /// Eagerly, the graph's way (whole context, anchors padded to `width`): its warm-up.
    Whole { width: usize },
    /// Through the graphs, anchors padded to `width`.
    Graph { width: usize },
}

/// A drafter replica's graphs and the shape they are kept for.
pub struct StepGraphs {
    wanted: bool,
    /// False: the graph's way eagerly, never captured (the check of the graphs).
    capture: bool,
    /// (rows, seq, anchor width) of the first batch that could run graphed.
    shape: Option<(i64, i64, usize)>,
    eager_steps: u32,
    graph: Option<DrafterGraph>,
    failed: bool,
}

struct DrafterGraph {
    inputs: StepInputs,
    fwd: Forwarded,
    /// The loss's gradient with respect to `fwd.out`, copied in each step.
    grad: Tensor,
    forward: Graph,
    backward: Option<Graph>,
}

impl StepGraphs {
    /// Graphs when asked for: `DFLASH_TOP_DRAFTER_GRAPH=1` (off by default: on a GPU shared
    /// with a target the whole-context attention costs more than the launches it saves, see
    /// docs/performance.md); `DFLASH_TOP_NO_GRAPHS=1` turns every graph off.
    pub fn from_env() -> StepGraphs {
        let asked = std::env::var("DFLASH_TOP_DRAFTER_GRAPH").is_ok_and(|v| v == "1");
        StepGraphs::with(asked && super::cuda::graphs_wanted())
    }

    /// Graphs wherever the step can run them.
    pub fn on() -> StepGraphs {
        StepGraphs::with(super::cuda::AVAILABLE)
    }

    /// Never graphs: every step eager, with windows.
    pub fn off() -> StepGraphs {
        StepGraphs::with(false)
    }

    /// Every step eagerly the way the graphs run it (whole context, padded anchors), never
    /// captured: what a graphed step must equal.
    pub fn graph_way_eagerly() -> StepGraphs {
        StepGraphs {
            capture: false,
            ..StepGraphs::with(true)
        }
    }

    fn with(wanted: bool) -> StepGraphs {
        StepGraphs {
            wanted,
            capture: true,
            shape: None,
            eager_steps: 0,
            graph: None,
            failed: false,
        }
    }

    /// Whether a graph is captured and replayed.
    pub fn captured(&self) -> bool {
        self.graph.as_ref().is_some_and(|g| g.backward.is_some())
    }

    /// How a step of `rows` x `seq` tokens whose fullest row needs `width` anchors runs;
    /// `usable`: on a CUDA device, on a stream of the thread's own, with no replica to reduce
    /// gradients with during backward.
    pub fn mode(&mut self, usable: bool, rows: i64, seq: i64, width: usize) -> StepMode {
        if !self.wanted || !usable || self.failed {
            return StepMode::Windows;
        }
        let (r, s, w) = *self.shape.get_or_insert((rows, seq, width));
        if (r, s) != (rows, seq) || width > w {
            return StepMode::Windows;
        }
        if self.eager_steps < WARM_STEPS || !self.capture {
            self.eager_steps += 1;
            return StepMode::Whole { width: w };
        }
        StepMode::Graph { width: w }
    }

    /// The forward of `x` through the graph (captured at the first call: `forward` is what it
    /// records, and must be the whole-context forward); the outputs are the graph's own tensors,
    /// written again by the next replay. An error: the capture failed, and no graph is used
    /// from now on.
    pub fn forward(
        &mut self,
        x: &StepInputs,
        forward: impl FnOnce(&StepInputs) -> Forwarded,
    ) -> Result<Forwarded> {
        let result = self.replay_forward(x, forward);
        if result.is_err() {
            self.give_up();
        }
        result
    }

    fn replay_forward(
        &mut self,
        x: &StepInputs,
        forward: impl FnOnce(&StepInputs) -> Forwarded,
    ) -> Result<Forwarded> {
        match &self.graph {
            Some(g) => {
                anyhow::ensure!(
                    g.inputs.same_shapes(x),
                    "the step's tensors are not the graph's shapes"
                );
                // Writing them bumps their autograd versions; from the second graphed step on
                // nothing reads those (backward is a replay too), so the check never trips.
                for (into, from) in g.inputs.tensors().into_iter().zip(x.tensors()) {
                    let mut into = into.shallow_clone();
                    into.copy_(from);
                }
            }
            None => {
                // The inputs are copies of this step's: the capture's backward, later in this
                // step, finds them as the forward saved them.
                let inputs = x.copy();
                let (graph, fwd) = Graph::capture(x.hidden.device(), || forward(&inputs))?;
                self.graph = Some(DrafterGraph {
                    grad: fwd.out.detach().zeros_like(),
                    inputs,
                    fwd,
                    forward: graph,
                    backward: None,
                });
            }
        }
        let g = self.graph.as_ref().expect("captured above");
        g.forward.replay()?;
        Ok(g.fwd.shallow_clone())
    }

    /// Backward through the drafter from the graph's output with the loss's gradient `grad`
    /// (captured at the first call after the forward's capture). An error: the capture failed;
    /// nothing ran, and no graph is used from now on.
    pub fn backward(&mut self, grad: &Tensor) -> Result<()> {
        let result = self.replay_backward(grad);
        if result.is_err() {
            self.give_up();
        }
        result
    }

    fn replay_backward(&mut self, grad: &Tensor) -> Result<()> {
        let g = self
            .graph
            .as_mut()
            .ok_or_else(|| anyhow::anyhow!("no forward graph to run backward through"))?;
        if g.backward.is_none() {
            let (out, static_grad) = (g.fwd.out.shallow_clone(), g.grad.shallow_clone());
            let (graph, done) = Graph::capture(out.device(), || {
                super::loss::backward_from(&out, &static_grad)
            })?;
            done?;
            g.backward = Some(graph);
            STATE.record(true);
        }
        g.grad.copy_(grad);
        g.backward.as_ref().expect("captured above").replay()
    }

    fn give_up(&mut self) {
        self.failed = true;
        self.graph = None;
        STATE.record(false);
    }
}
