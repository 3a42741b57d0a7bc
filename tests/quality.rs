//! Acceptance side by side (python/peer/quality.py at its CPU size): a chat target trained here,
//! its own greedy replies as data, a drafter trained by this binary and one by SpecForge 0.2.0's
//! own DFlash trainer from the same init, both measured in z-lab's dflash on held-out prompts.
//! What must hold whatever the recipe: both trained drafters are accepted well above the
//! untrained init, the table compares the two at equal target tokens and at equal wall time,
//! dflash's output is the target's greedy reply, and every number is finite. And the goal of
//! our recipe: at equal target tokens ours is within SpecForge's interval or above it; at equal
//! wall time, above SpecForge's mean.

use serde_json::Value;
use std::path::Path;

fn num(row: &Value, key: &str) -> f64 {
    let v = row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {row}"));
    assert!(v.is_finite(), "{key} = {v} in {row}");
    v
}

fn rows<'a>(table: &'a Value, row: &str) -> Vec<&'a Value> {
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["row"] == row)
        .collect()
}

fn by_trainer<'a>(rows: &[&'a Value], trainer: &str) -> &'a Value {
    let found: Vec<_> = rows.iter().filter(|r| r["trainer"] == trainer).collect();
    assert_eq!(found.len(), 1, "one {trainer} row expected in {rows:?}");
    found[0]
}

#[test]
fn drafters_of_both_trainers_are_accepted_in_dflash_side_by_side() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("quality.json");
    let o = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("python/peer/quality.py"))
        // Two `dflash-top generate` processes make the data, as eight do on a GPU: a reply
        // handed back to the wrong conversation would break the language check of its topic.
        .args(["--size", "ci", "--gen-procs", "2", "--json"])
        .arg(&out)
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_dflash-top"))
        .arg("--work")
        .arg(tmp.path().join("work"))
        .current_dir(root)
        .output()
        .expect("the venv's python runs (make test installs it)");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "quality.py failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{stdout}");
    let table: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let prompts = table["eval_prompts"].as_u64().unwrap();
    assert!(prompts >= 8, "too few held-out prompts: {prompts}");
    let max_length = table["recipe"]["max_length"].as_f64().unwrap();

    let floor = rows(&table, "floor");
    assert_eq!(floor.len(), 1);
    let floor_high = num(floor[0], "ci_high");
    assert!(
        num(floor[0], "acceptance") >= 1.0,
        "an acceptance length is at least 1: {}",
        floor[0]
    );

    for row in ["equal tokens", "equal wall"] {
        let rs = rows(&table, row);
        let (ours, sf) = (by_trainer(&rs, "dflash-top"), by_trainer(&rs, "specforge"));
        for r in [ours, sf] {
            let (acc, lo, hi) = (num(r, "acceptance"), num(r, "ci_low"), num(r, "ci_high"));
            assert!(lo <= acc && acc <= hi, "{r}");
            assert!(
                acc > floor_high,
                "{row}: {} drafter's acceptance {acc:.3} is not above the untrained one's \
                 interval (up to {floor_high:.3})",
                r["trainer"]
            );
            assert!(
                num(r, "target_tokens") > 0.0 && num(r, "wall_s") > 0.0,
                "{r}"
            );
            let per_prompt = r["per_prompt"].as_array().unwrap();
            assert_eq!(per_prompt.len() as u64, prompts);
            for x in per_prompt {
                let x = x.as_f64().unwrap();
                assert!(
                    x.is_finite() && x >= 1.0,
                    "per-prompt acceptance {x} in {r}"
                );
            }
            // Lossless greedy speculative decoding: dflash wrote what `dflash-top generate`
            // wrote (the chat template and the target agree between the two).
            assert_eq!(r["same_as_greedy"].as_u64(), Some(prompts), "{r}");
        }
        // Our trainer reports its own tau; SpecForge's DFlash loss reports none.
        num(ours, "tau");
        let (t_ours, t_sf) = (num(ours, "target_tokens"), num(sf, "target_tokens"));
        let (w_ours, w_sf) = (num(ours, "wall_s"), num(sf, "wall_s"));
        let (a_ours, a_sf) = (num(ours, "acceptance"), num(sf, "acceptance"));
        if row == "equal tokens" {
            assert!(
                (t_ours - t_sf).abs() <= max_length,
                "not equal target tokens: dflash-top {t_ours}, specforge {t_sf}"
            );
            assert!(
                a_ours >= num(sf, "ci_low"),
                "at equal target tokens ours ({a_ours:.3}) is below SpecForge's interval \
                 ({:.3} ..)",
                num(sf, "ci_low")
            );
        } else {
            assert!(
                w_ours.max(w_sf) <= 1.5 * w_ours.min(w_sf),
                "not equal wall time: dflash-top {w_ours:.1}s, specforge {w_sf:.1}s"
            );
            assert!(
                a_ours > a_sf,
                "at equal wall time ours ({a_ours:.3}) is not above SpecForge's ({a_sf:.3})"
            );
        }
    }
}
