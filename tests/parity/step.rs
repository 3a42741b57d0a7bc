//! One training step as SpecForge's: the drafter step of the library (src/engine/train/step.rs:
//! block inputs, mask and labels from given anchors, the drafter, the chunked decayed loss,
//! backward, the clip and AdamW at the schedule's lr) against SpecForge 0.2.0's own
//! `OnlineDFlashModel.forward`, backward and one `BF16Optimizer` step, on the same drafter
//! weights, batch and anchors (tests/reference/specforge_step.py; `make reference` writes them).
//!
//! SpecForge ran twice from the same bf16-representable weights and inputs: in bf16, as it trains
//! (fp32 master copies, bf16 everything else), and in fp32. Our CPU step computes in f32, so it
//! must equal the fp32 run to f32 rounding and the bf16 run within bf16's error, which is measured
//! here as the gap between SpecForge's own two runs (see `BF16`).

use dflash_top::engine::checkpoint::{load_weights, read_drafter_spec};
use dflash_top::engine::data::{Doc, DocSource, Packer};
use dflash_top::engine::model::drafter::Drafter;
use dflash_top::engine::train::grad_mean::Single;
use dflash_top::engine::train::optim::AdamW;
use dflash_top::engine::train::schedule::Schedule;
use dflash_top::engine::train::step::{DrafterStep, StepOutcome, StepProbe};
use dflash_top::engine::train::step_graphs::StepGraphs;
use dflash_top::telemetry::Phase;
use std::collections::HashMap;
use std::path::PathBuf;
use tch::{nn::VarStore, Device, Kind, Tensor};

type Named = HashMap<String, Tensor>;

fn step_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/reference/parity/step");
    assert!(
        dir.join("step.json").is_file(),
        "{} is missing: `make test` (or `make reference`) writes it with SpecForge 0.2.0",
        dir.display()
    );
    dir
}

fn read(name: &str) -> Named {
    Tensor::read_safetensors(step_dir().join(name))
        .unwrap()
        .into_iter()
        .collect()
}

fn settings() -> serde_json::Value {
    let text = std::fs::read_to_string(step_dir().join("step.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    f64::try_from(t.to_kind(Kind::Double).view([-1]).get(0)).unwrap()
}

/// Relative L2 distance of `a` from `b`.
fn rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    scalar(&(&a - &b).norm()) / scalar(&b.norm()).max(1e-30)
}

/// How far each side may be from a SpecForge run.
#[derive(Clone, Copy, Debug)]
struct Tolerance {
    name: &'static str,
    /// Relative, of the loss and the gradients' norm.
    loss: f64,
    /// Relative L2 of each gradient tensor and of each first moment (a gradient times
    /// (1 - beta1) and the clip's factor).
    grad: f64,
    /// Of the updated weights, as a share of the step's lr, beyond what the gradients' own
    /// difference explains. Adam's first step moves a weight by `lr * x / (|x| + eps)`, x its
    /// clipped gradient (bias-corrected: `exp_avg / (1 - beta1)`): +-lr wherever |x| >> eps,
    /// so a gradient within the other side's error of zero (or within eps of it) may move its
    /// weight differently, up to 2 lr where the signs differ. That part, computed from each
    /// side's own first moment, is allowed; anything beyond it (the lr, the bias correction,
    /// betas, weight decay) is not.
    update: f64,
    /// The share of weights whose gradients may differ in sign.
    flips: f64,
}

/// (beta1, eps) of both sides' AdamW (`our_step` checks ours against step.json).
const ADAM: (f64, f64) = (0.9, 1e-8);

/// Against SpecForge in fp32: f32 rounding, through a differently ordered but equal computation
/// (our chunked loss writes the logits' gradient directly; tiled attention; one flat buffer for
/// the norm). Measured: loss 6e-8, gradients' norm 3e-6, gradients 7e-7, first moments 3e-6
/// (the clip's factor carries the norm's), updates 4e-5 of the lr, no flips; about 3x above.
const FP32: Tolerance = Tolerance {
    name: "fp32",
    loss: 1e-5,
    grad: 1e-5,
    update: 1e-4,
    flips: 1e-4,
};

/// Against SpecForge in bf16: bf16 keeps 8 bits of mantissa (2^-8 = 0.4% a rounding), and the
/// drafter's two layers forward and back compound it: SpecForge's own bf16 gradients are 0.6% to
/// 1.5% (relative L2, per tensor) from its fp32 ones on these inputs. Measured against ours:
/// loss 8e-4, gradients' norm 2e-3, gradients up to 1.5e-2, first moments 1.6e-2, updates
/// (beyond the part the gradients explain) 8e-5 of the lr, 0.4% of the gradients of opposite
/// signs; about 2x above.
const BF16: Tolerance = Tolerance {
    name: "bf16",
    loss: 5e-3,
    grad: 3e-2,
    update: 1e-3,
    flips: 1e-2,
};

/// A source of the reference's two documents, one a row: each row's tokens up to where its
/// padding (a document id of its own) starts.
struct Rows {
    docs: Vec<Doc>,
    next: usize,
}

impl DocSource for Rows {
    fn next_doc(&mut self) -> anyhow::Result<Doc> {
        let d = &self.docs[self.next % self.docs.len()];
        self.next += 1;
        Ok(Doc {
            ids: d.ids.clone(),
            loss_mask: d.loss_mask.clone(),
        })
    }
    fn position(&self) -> u64 {
        self.next as u64
    }
}

/// Records every parameter's gradient when the step reaches the clip: after backward, before the
/// clip scales them and the update clears them.
struct Gradients {
    params: Vec<(String, Tensor)>,
    taken: Named,
}

impl StepProbe for Gradients {
    fn mark(&mut self, phase: Phase) {
        if phase == Phase::Clip {
            for (name, p) in &self.params {
                self.taken.insert(name.clone(), p.grad().copy());
            }
        }
    }
}

/// Ours: the outcome, the gradients, and the optimizer's state after the step (`master.`,
/// `exp_avg.`, `exp_avg_sq.` per tensor, as its state file holds them); and the lr.
struct Ours {
    outcome: StepOutcome,
    grads: Named,
    state: Named,
    lr: f64,
}

/// Our step on the reference's drafter, batch and anchors, through the library's drafter step,
/// computing in `kind`: f32 (the CPU's recipe), or bf16 (the GPU's: bf16 working weights, the
/// embedding, lm head and hidden states in bf16, fp32 masters; here the plain update, not the
/// GPU's fused kernel); `change` may alter the step before it runs (to see the comparison fail).
fn our_step(kind: Kind, change: impl FnOnce(&mut DrafterStep)) -> Ours {
    let dir = step_dir();
    let batch = read("batch.safetensors");
    let set = settings();
    let s = &set["settings"];
    let drafter_dir = dir.join("drafter");
    let spec = read_drafter_spec(&drafter_dir).unwrap();
    assert_eq!(spec.block_size, s["block_size"].as_i64().unwrap());
    let vs = VarStore::new(Device::Cpu);
    let model = Drafter::new(&vs.root(), &spec);
    load_weights(&drafter_dir, &vs).unwrap();
    let mut optimizer =
        AdamW::for_drafter(vs.variables().into_iter().collect(), Default::default());
    if kind == Kind::BFloat16 {
        optimizer = optimizer.with_bf16_weights();
    }
    let mut step = DrafterStep {
        model,
        optimizer,
        spec,
        embed: batch["embed"].to_kind(kind),
        lm_head: batch["lm_head"].to_kind(kind),
        device: Device::Cpu,
        replicas: Box::new(Single),
        loss_chunk_mib: 1,
        graphs: StepGraphs::off(),
    };
    assert!(
        step.optimizer.layout().all(|(_, p, _)| p.kind() == kind),
        "the weights the drafter computes with are {kind:?}"
    );
    // The recipe the engine trains with is the one SpecForge was given.
    let opt = &step.optimizer;
    let betas: Vec<f64> = serde_json::from_value(s["betas"].clone()).unwrap();
    assert_eq!(vec![opt.beta1, opt.beta2], betas);
    assert_eq!(opt.eps, s["eps"].as_f64().unwrap());
    assert_eq!((opt.beta1, opt.eps), ADAM);
    assert_eq!(opt.weight_decay, s["weight_decay"].as_f64().unwrap());
    change(&mut step);

    // The batch as the engine packs it: each row one document, the second padded.
    let ids = Vec::<i64>::try_from(batch["input_ids"].view([-1])).unwrap();
    let mask: Vec<bool> = Vec::<u8>::try_from(batch["loss_mask"].view([-1]))
        .unwrap()
        .into_iter()
        .map(|m| m != 0)
        .collect();
    let docs = Vec::<i64>::try_from(batch["doc_ids"].view([-1])).unwrap();
    let (rows, seq) = (batch["input_ids"].size()[0], batch["input_ids"].size()[1]);
    let mut source = Rows {
        docs: (0..rows as usize)
            .map(|r| {
                let span = r * seq as usize..(r + 1) * seq as usize;
                let len = docs[span.clone()].iter().filter(|&&d| d == 0).count();
                Doc {
                    ids: ids[span.clone()][..len].to_vec(),
                    loss_mask: mask[span][..len].to_vec(),
                }
            })
            .collect(),
        next: 0,
    };
    let b = Packer::new().pack(&mut source, rows, seq).unwrap();
    assert_eq!(b.host_loss_mask, mask, "packed as the reference's batch");
    assert_eq!(Vec::<i64>::try_from(b.input_ids.view([-1])).unwrap(), ids);
    let padded: Vec<bool> = docs.iter().map(|&d| d != 0).collect();
    let ours: Vec<bool> = b.host_doc_ids.iter().map(|&d| d != 0).collect();
    assert_eq!(ours, padded, "the padding is a document of its own");

    let anchors = Vec::<i64>::try_from(batch["anchors"].view([-1])).unwrap();
    let keep = Vec::<u8>::try_from(batch["anchor_valid"].view([-1])).unwrap();
    let width = batch["anchors"].size()[1] as usize;
    let per_row: Vec<Vec<i64>> = (0..rows as usize)
        .map(|r| {
            (0..width)
                .filter(|&i| keep[r * width + i] != 0)
                .map(|i| anchors[r * width + i])
                .collect()
        })
        .collect();

    let schedule = Schedule::Cosine {
        total: s["total_steps"].as_u64().unwrap(),
    };
    let lr = schedule.lr(s["lr"].as_f64().unwrap(), step.optimizer.step as u64);
    let mut probe = Gradients {
        params: step
            .optimizer
            .layout()
            .map(|(name, p, _)| (name.to_string(), p.shallow_clone()))
            .collect(),
        taken: HashMap::new(),
    };
    let outcome = step
        .run(&batch["hidden"].to_kind(kind), &b, &per_row, lr, &mut probe)
        .unwrap();
    assert!(outcome.finite, "{outcome:?}");
    let state_file = tempfile::NamedTempFile::new().unwrap();
    step.optimizer.save(state_file.path()).unwrap();
    let state = Tensor::read_safetensors(state_file.path())
        .unwrap()
        .into_iter()
        .collect();
    Ours {
        outcome,
        grads: probe.taken,
        state,
        lr,
    }
}

/// Where ours differs from SpecForge's run `theirs` beyond `tol`: one line each; and the
/// largest gap of each kind (the first word of its line), as a share of its limit.
fn differences(ours: &Ours, theirs: &Named, tol: Tolerance) -> (Vec<String>, Vec<String>) {
    let mut bad = Vec::new();
    let mut worst: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    let mut check = |what: String, gap: f64, limit: f64| {
        let kind = what
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let w = worst.entry(kind).or_insert((0.0, limit));
        if gap / limit > w.0 / w.1 {
            *w = (gap, limit);
        }
        if gap.is_nan() || gap > limit {
            bad.push(format!("{}: {what}: {gap:.3e} > {limit:.1e}", tol.name));
        }
    };
    let their_lr = scalar(&theirs["lr"]);
    check("lr".into(), (ours.lr - their_lr).abs() / their_lr, 1e-12);
    let loss = scalar(&theirs["loss"]);
    check(
        format!("loss {} against {loss}", ours.outcome.loss),
        (ours.outcome.loss as f64 - loss).abs() / loss,
        tol.loss,
    );
    let norm = scalar(&theirs["grad_norm"]);
    check(
        format!("grad norm {} against {norm}", ours.outcome.grad_norm),
        (ours.outcome.grad_norm as f64 - norm).abs() / norm,
        tol.loss,
    );
    let start = weights_before();
    let mut flipped = 0i64;
    let mut total = 0i64;
    for (name, g) in &ours.grads {
        let their_g = &theirs[&format!("grad.{name}")];
        check(format!("gradient of {name}"), rel(g, their_g), tol.grad);
        for moment in ["exp_avg", "exp_avg_sq"] {
            let key = format!("{moment}.{name}");
            // The second moment is the gradient squared: twice the error.
            let limit = if moment == "exp_avg" { 1.0 } else { 2.0 } * tol.grad;
            let gap = rel(&ours.state[&key], &theirs[&key]);
            check(format!("{moment} of {name}"), gap, limit);
        }
        // The update, beyond what the two sides' clipped gradients explain.
        let key = format!("master.{name}");
        let ours_moved = &ours.state[&key] - &start[name];
        let theirs_moved = &theirs[&key] - &start[name];
        let adam = |m: &Tensor| {
            let x = m.to_kind(Kind::Double) / (1.0 - ADAM.0);
            x.abs().g_add_scalar(ADAM.1).reciprocal() * x * ours.lr
        };
        let m = format!("exp_avg.{name}");
        let explained = (adam(&ours.state[&m]) - adam(&theirs[&m])).abs();
        let gap = (ours_moved - theirs_moved).abs().to_kind(Kind::Double) - explained;
        check(
            format!("update of {name}, as a share of lr"),
            scalar(&gap.max()) / ours.lr,
            tol.update,
        );
        let flips = g.sign().ne_tensor(&their_g.sign());
        flipped += i64::try_from(flips.sum(Kind::Int64)).unwrap();
        total += g.numel() as i64;
    }
    check(
        format!("flips ({flipped} of {total} gradients of opposite signs)"),
        flipped as f64 / total as f64,
        tol.flips,
    );
    assert_eq!(
        ours.grads.len(),
        theirs.keys().filter(|k| k.starts_with("grad.")).count(),
        "the same parameters on both sides"
    );
    let worst = worst
        .into_iter()
        .map(|(k, (gap, limit))| format!("{k} {gap:.2e} (limit {limit:.0e})"))
        .collect();
    (bad, worst)
}

/// The drafter's weights before the step, in f32 (bf16 values: the same on every side).
fn weights_before() -> Named {
    Tensor::read_safetensors(step_dir().join("drafter/model.safetensors"))
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.to_kind(Kind::Float)))
        .collect()
}

/// Loss, every gradient, the AdamW moments and every updated weight of one step equal SpecForge's
/// (bf16 and fp32 runs) within the tolerances above; and the step is not a trivial one: the clip
/// is active (the gradients' norm above 1.0), step 1's lr is not zero, every weight moved.
#[test]
fn one_step_is_specforges() {
    let ours = our_step(Kind::Float, |_| {});
    eprintln!("ours: {:?}, lr {}", ours.outcome, ours.lr);
    for (run, tol) in [("fp32", FP32), ("bf16", BF16)] {
        let theirs = read(&format!("{run}.safetensors"));
        let (bad, worst) = differences(&ours, &theirs, tol);
        eprintln!("against SpecForge {run}: {}", worst.join(", "));
        assert!(
            bad.is_empty(),
            "against SpecForge {run}:\n{}",
            bad.join("\n")
        );
    }
    assert!(
        ours.outcome.grad_norm > 1.0,
        "the clip acts: {:?}",
        ours.outcome
    );
    assert!(ours.lr > 0.0);
    let start = weights_before();
    for (name, w) in &start {
        let moved = &ours.state[&format!("master.{name}")] - w;
        assert!(
            scalar(&moved.abs().max()) > 0.5 * ours.lr,
            "{name} moved by about the lr"
        );
    }
}

/// The same step computing in bf16, as on a GPU (bf16 working weights and gradients, fp32
/// masters), against both of SpecForge's runs within bf16's limits: as close to the exact step
/// as SpecForge's own bf16 step is, and to SpecForge's bf16 step within the same limits.
#[test]
fn one_step_in_bf16_is_specforges() {
    let ours = our_step(Kind::BFloat16, |_| {});
    eprintln!("ours in bf16: {:?}, lr {}", ours.outcome, ours.lr);
    for run in ["fp32", "bf16"] {
        let (bad, worst) = differences(&ours, &read(&format!("{run}.safetensors")), BF16);
        eprintln!("against SpecForge {run}: {}", worst.join(", "));
        assert!(
            bad.is_empty(),
            "against SpecForge {run}:\n{}",
            bad.join("\n")
        );
    }
}

/// The comparison catches a change of the recipe: here weight decay (SpecForge's is 0, as ours),
/// which moves every weight a little more than the lr alone.
#[test]
fn the_step_comparison_fails_when_the_recipe_changes() {
    let ours = our_step(Kind::Float, |s| s.optimizer.weight_decay = 0.1);
    for (run, tol) in [("fp32", FP32), ("bf16", BF16)] {
        let (bad, _) = differences(&ours, &read(&format!("{run}.safetensors")), tol);
        assert!(
            bad.iter().any(|l| l.contains("update of")),
            "weight decay 0.1 passes against SpecForge {run}: {bad:?}"
        );
    }
}

/// The lr of every update of runs of a few lengths, against SpecForge's `BF16Optimizer`
/// scheduler (cosine, 4% warm-up): the warm-up steps equal (both round the warm-up down to
/// whole steps), the cosine after it within 0.5% of the peak. SpecForge chains torch's
/// recursive `CosineAnnealingLR` after its warm-up, which overshoots the peak by 0.03% at the
/// hand-off and, after a one-step warm-up, runs a step behind the closed form (0.3%); with no
/// warm-up at all (runs under 25 steps) its first lr is 5% above the peak, where ours warms up
/// over one step and never exceeds it (docs/quality.md, "Parity of one step").
#[test]
fn the_lr_schedule_is_specforges() {
    let set = settings();
    let peak = set["settings"]["lr"].as_f64().unwrap();
    let share = set["settings"]["warmup_ratio"].as_f64().unwrap();
    let runs = set["schedules"].as_object().unwrap();
    assert!(runs.len() >= 3);
    for (total, theirs) in runs {
        let total: u64 = total.parse().unwrap();
        let theirs: Vec<f64> = serde_json::from_value(theirs.clone()).unwrap();
        assert_eq!(theirs.len() as u64, total);
        let warm = (total as f64 * share) as usize;
        let schedule = Schedule::Cosine { total };
        for (step, &t) in theirs.iter().enumerate() {
            let o = schedule.lr(peak, step as u64);
            assert!(o <= peak * (1.0 + 1e-12), "total {total}, step {step}: {o}");
            if warm == 0 {
                continue;
            }
            let limit = if step < warm {
                1e-12 * peak
            } else {
                5e-3 * peak
            };
            assert!(
                (o - t).abs() <= limit,
                "total {total}, step {step}: ours {o}, SpecForge's {t}"
            );
        }
    }
}
