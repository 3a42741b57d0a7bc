//! End to end on the CPU: the language target of tests/reference/lm_target.py writes its greedy
//! continuations (`dflash-top generate`), a drafter trains on them (`dflash-top train
//! --headless`), and z-lab's dflash loads the saved drafter and decodes speculatively with it
//! (tests/reference/measure_tau.py): its acceptance length must be well above an untrained
//! drafter's and close to the tau the trainer reported.

use crate::generate::lm_dir;
use crate::support::{self, field, run, stderr};
use std::path::Path;

const STEPS: u64 = 200;
const BLOCK: &str = "16";

fn measure(drafter: &Path, target: &Path, greedy: &Path, rows: usize) -> serde_json::Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tests/reference/measure_tau.py"))
        .args([drafter, target, greedy])
        .arg(rows.to_string())
        .output()
        .expect("the venv's python runs (make test installs it)");
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.lines().last().unwrap()).unwrap()
}

#[test]
fn a_drafter_trained_on_target_generated_data_is_accepted_in_dflash() {
    let lm = lm_dir();
    let target = lm.join("target");
    let tmp = tempfile::tempdir().unwrap();
    let (train, eval) = (
        tmp.path().join("train.jsonl"),
        tmp.path().join("eval.jsonl"),
    );
    for (prompts, out) in [
        ("train_prompts.jsonl", &train),
        ("eval_prompts.jsonl", &eval),
    ] {
        let o = run(&[
            "generate",
            "--target",
            target.to_str().unwrap(),
            "--data",
            lm.join(prompts).to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--max-new-tokens",
            "40",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let save = tmp.path().join("runs");
    let steps = STEPS.to_string();
    let o = support::train(&[
        "--target",
        target.to_str().unwrap(),
        "--data",
        train.to_str().unwrap(),
        "--mask-token-id",
        "255",
        "--drafter-layers",
        "2",
        "--block-size",
        BLOCK,
        "--seq-len",
        "128",
        "--batch",
        "4",
        "--anchors",
        "8",
        // One step a batch (a --target run's default is 6): 8 anchors a batch of 4 rows.
        "--steps-per-batch",
        "1",
        "--lr",
        "3e-3",
        "--steps",
        &steps,
        "--save-dir",
        save.to_str().unwrap(),
        "--save-every",
        &steps,
        "--interval",
        "0.25",
        "--seed",
        "0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The trainer's tau: the mean of its interval lines over the last quarter of the run.
    let out = String::from_utf8_lossy(&o.stdout);
    let late: Vec<f64> = out
        .lines()
        .filter(|l| l.starts_with("t="))
        .filter(|l| field(l, "step").is_some_and(|s| s >= 0.75 * STEPS as f64))
        .filter_map(|l| field(l, "tau"))
        .collect();
    assert!(
        !late.is_empty(),
        "no interval line in the last quarter: {out}"
    );
    let trainer_tau = late.iter().sum::<f64>() / late.len() as f64;

    let drafter = save.join(format!("step-{STEPS:06}"));
    // On (part of) the data it trained on, as the trainer measures; then on held-out prompts.
    // 32 rows: over fewer, dflash's tau moved by more than the tolerance below from run to run.
    let seen = measure(&drafter, &target, &train, 32);
    let held_out = measure(&drafter, &target, &eval, 8);
    eprintln!(
        "trainer tau {trainer_tau:.3}; dflash on trained prompts {seen}; held out {held_out}"
    );
    for m in [&seen, &held_out] {
        assert_eq!(
            m["same_as_greedy"], true,
            "dflash's output differs from generate's: {m}"
        );
        let (tau, untrained) = (
            m["tau"].as_f64().unwrap(),
            m["untrained_tau"].as_f64().unwrap(),
        );
        assert!(
            untrained < 1.5,
            "an untrained drafter is accepted too often: {m}"
        );
        assert!(
            tau >= 4.0 && tau >= untrained + 3.0,
            "tau {tau} vs untrained {untrained}: {m}"
        );
    }
    // The trainer's blocks start anywhere up to a reply's second-last token, those near its
    // end cut short by it as each sequence's last round of decoding is; dflash's tau over all
    // rounds counts one cut-short round a sequence, over whole rounds none. The trainer's tau
    // lies between the two (within 1.5 either way).
    let (all, whole) = (
        seen["tau"].as_f64().unwrap(),
        seen["tau_whole_rounds"].as_f64().unwrap(),
    );
    assert!(
        all - 1.5 <= trainer_tau && trainer_tau <= whole + 1.5,
        "the trainer's tau {trainer_tau} is not between dflash's over all rounds ({all}) and \
         over whole rounds ({whole}), within 1.5"
    );
}
