"""The report of python/peer/quality.py: rows per (row, trainer, setting) with the mean and 95%
interval of acceptance over (seed, prompt), paired differences ours minus SpecForge, learning
curves, the printed table.

Run on its own, it rebuilds the table from a --work directory's kept runs and measurements, for a
run cut off before its report (a GPU call's minutes ending in the acceptance measurement): every
run whose drafter was measured, with what was not measured named.

    python3 python/peer/quality_report.py WORK [--json OUT] [--size gpu --device 'one H100']
"""

import argparse
import glob
import json
import math
import os
import sys

from quality_runs import label


# Two-sided 95% quantiles of Student's t (df 1..30), then the normal's.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def mean_ci(xs):
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = T95[n - 2] if n - 1 <= len(T95) else 1.96
    h = t * sd / math.sqrt(n)
    return m, m - h, m + h


def group(runs):
    """One table row per (row, trainer, setting): its seeds' runs, acceptance pooled over
    (seed, prompt), and per prompt the mean over seeds."""
    out = {}
    for r in runs:
        k = (r["row"], r["trainer"], label(r["trainer"], r["setting"]))
        out.setdefault(k, []).append(r)
    rows = []
    for (row, trainer, lab), rs in out.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        n = len(rs)
        per_seed = [r["per_prompt"] for r in rs]
        rows.append({
            "row": row,
            "trainer": trainer,
            "label": lab,
            "setting": rs[0]["setting"],
            "seeds": [r["seed"] for r in rs],
            "steps": sum(r["steps"] for r in rs) / n,
            "target_tokens": sum(r["target_tokens"] for r in rs) / n,
            "wall_s": sum(r["wall_s"] for r in rs) / n,
            "warm_s": sum(r["warm_s"] for r in rs) / n,
            "tau": None if trainer != "dflash-top" else sum(r["tau"] or 0 for r in rs) / n,
            "same_run": bool(rs[0].get("same_run")),
            "per_seed": per_seed,
            "per_prompt": [sum(x) / n for x in zip(*per_seed)],
            "pooled": [x for p in per_seed for x in p],
            "same_as_greedy": min(r["same_as_greedy"] for r in rs),
        })  # fmt: skip
    return rows


def paired(rows):
    """Paired differences over (seed, prompt), ours minus SpecForge: per row kind, the primary
    settings; for the sweep, each trainer's best setting (highest mean) against the other's."""
    out = []

    def diff(row, a, b):
        common = [s for s in a["seeds"] if s in b["seeds"]]
        d = [x - y for s in common
             for x, y in zip(a["per_seed"][a["seeds"].index(s)],
                             b["per_seed"][b["seeds"].index(s)])]  # fmt: skip
        m, lo, hi = mean_ci(d)
        out.append({"row": row, "ours": a["label"], "specforge": b["label"], "seeds": common,
                    "n": len(d), "mean": m, "ci_low": lo, "ci_high": hi})  # fmt: skip

    for row in ("equal tokens", "equal wall"):
        rs = [r for r in rows if r["row"] == row]
        o = [r for r in rs if r["trainer"] == "dflash-top"]
        f = [r for r in rs if r["trainer"] == "specforge"]
        if o and f:
            diff(row, o[0], f[0])
    sw = [r for r in rows if r["row"] == "sweep"]
    best = {}
    for r in sw:
        m = sum(r["pooled"]) / len(r["pooled"])
        if r["trainer"] not in best or m > best[r["trainer"]][0]:
            best[r["trainer"]] = (m, r)
    if len(best) == 2:
        diff("sweep best", best["dflash-top"][1], best["specforge"][1])
    return out


def print_data(d):
    if "replies_first_word_is_seed" not in d:  # a prepared target's data (quality_real.py)
        print(f"data: {json.dumps(d)}", flush=True)
        return
    print(
        f"data: {d['train_conversations']} training conversations, {d['train_tokens']} tokens "
        f"({d['train_supervised_tokens']} with loss); of the target's {d['target_replies']} "
        f"replies {d['replies_first_word_is_seed']} start with the user's seed word, "
        f"{d['replies_length_in_bucket']} have a length in the bucket asked for (mean "
        f"{d['reply_words_mean']:.1f} words, asked {d['reply_words_asked_mean']:.1f}), "
        f"{d['replies_ended_at_stop_word']} end at their stop word, {d['rule_follow']:.1%} of "
        f"reply tokens follow the topic's map; distinct replies: {d['distinct_train_replies']} "
        f"training, {d['distinct_eval_replies']} held-out; held-out in training: "
        f"{d['eval_prompts_in_train']} prompts, {d['eval_replies_in_train']} replies "
        f"({d['eval_dropped_as_in_train']} held-out conversations dropped as repeating training)",
        flush=True,
    )


def print_table(t):
    def num(x, p):
        return "–" if x is None else f"{x:.{p}f}"

    print(
        f"\nacceptance length in dflash, {t['size']} size, {t['eval_prompts']} held-out prompts "
        f"x seeds {t['seeds']} ({t['device']}, cores {t['cores']}); block "
        f"{t['recipe'].get('block', '?')}"
    )
    head = f"{'row':<13} {'trainer':<11} {'setting':<30} {'steps':>6} {'target tok':>10} "
    head += f"{'wall s':>7} {'warm s':>7} {'accept':>7} {'95% CI':>15} {'tau':>6}"
    print(head)
    print("-" * len(head))
    for r in t["rows"]:
        ci = f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        same = " (same run)" if r.get("same_run") else ""
        print(
            f"{r['row']:<13} {r['trainer']:<11} {r['label']:<30} {num(r.get('steps'), 0):>6} "
            f"{r['target_tokens']:>10.0f} {r['wall_s']:>7.1f} {r['warm_s']:>7.1f} "
            f"{r['acceptance']:>7.3f} {ci:>15} {num(r.get('tau'), 2):>6}{same}"
        )
    for p in t["paired"]:
        print(
            f"paired, {p['row']}: ours ({p['ours']}) - SpecForge ({p['specforge']}) = "
            f"{p['mean']:+.2f} [{p['ci_low']:+.2f}, {p['ci_high']:+.2f}] over {p['n']} "
            f"(seed, prompt) pairs"
        )
    c = t.get("measure_check")
    if c:
        print(f"measured by {c['method']}", end="")
        if c["drafters"]:
            print(f"; {c['drafters']} drafters also by {c['other']}: {c['equal']}/{c['prompts']} "
                  f"prompts equal, max |diff| {c['max_abs']:.3f}, mean diff "
                  f"{c['mean_diff']:+.4f}", end="")  # fmt: skip
        print()
    print_data(t["data"])
    if "elapsed_s" in t:
        print(f"elapsed {t['elapsed_s']:.0f}s")


def curves_of(runs, measured):
    """Acceptance along each equal-tokens run with saved points (`curve`), at the points
    measured: against target tokens and seconds after the first step."""
    curves = []
    for r in runs:
        if r["row"] != "equal tokens" or len(r["curve"]) < 2:
            continue
        pts = [
            {"step": step, "target_tokens": x, "seconds": sec,
             "acceptance": sum(measured[d][0]) / len(measured[d][0])}
            for step, x, sec, d in r["curve"] if d in measured
        ]  # fmt: skip
        curves.append({"trainer": r["trainer"], "label": label(r["trainer"], r["setting"]),
                       "seed": r["seed"], "points": pts})  # fmt: skip
    return curves


def table_of(runs, floor, curves, meta):
    """The table: `meta` (size, device, data, recipe...) with the rows (the untrained init's
    acceptance per prompt, `floor`, then one per group of `runs`), paired differences, curves."""
    rows = [{"trainer": "untrained init", "row": "floor", "label": "seed 0", "seeds": [0],
             "target_tokens": 0, "wall_s": 0.0, "warm_s": 0.0, "per_prompt": floor}]  # fmt: skip
    rows += group(runs)
    for r in rows:
        m, lo, hi = mean_ci(r.get("pooled", r["per_prompt"]))
        r.update(acceptance=m, ci_low=lo, ci_high=hi)
    return {**meta, "rows": rows, "paired": paired(rows), "curves": curves,
            "runs": [{k: v for k, v in r.items() if k != "trace"} for r in runs]}  # fmt: skip


ROW_OF_NAME = {"tokens": "equal tokens", "wall": "equal wall", "sweep": "sweep"}


def row_of(run_dir):
    """The table row of a run by its folder's name (`ours-tokens-s0-KEY`, `sf-wall1-s0-KEY`,
    `ours-sweep3-s0-KEY`), or None for a folder that is no run of a row."""
    parts = os.path.basename(run_dir).split("-")
    return ROW_OF_NAME.get(parts[1].rstrip("0123456789")) if len(parts) > 1 else None


def kept_acceptance(d, method="decode"):
    """(per prompt, same as greedy) kept beside the drafter in `d` by `method` (decode: the
    `acceptance-*.json` files, replay: `replay-*.json`), or None if not measured."""
    prefix = "acceptance" if method == "decode" else "replay"
    found = sorted(glob.glob(os.path.join(d, f"{prefix}-*.json")))
    if len(found) > 1:
        raise SystemExit(f"{d}: {len(found)} measurements (different prompts or lengths); "
                         "keep the one this report should use")  # fmt: skip
    if not found:
        return None
    with open(found[0]) as f:
        got = json.load(f)
    return got["per_prompt"], got["same_as_greedy"]


def collect(work, method="decode"):
    """(runs, measured, floor, missing, data counts) from the kept runs under `work` (quality.py's
    --work, or its `q` folder). A run's drafter paths are read relative to its own folder, so a work
    directory copied from another machine will do."""
    if os.path.isdir(os.path.join(work, "q")):
        work = os.path.join(work, "q")
    runs, measured, missing = [], {}, []
    least_warm = {}  # trainer -> least warm_s of its equal-tokens runs, measured or not

    def here(path, run_dir):
        name = os.path.basename(run_dir)
        return os.path.join(work, path[path.index(name):]) if name in path else path

    for f in sorted(glob.glob(os.path.join(work, "*", "quality-run.json"))):
        run_dir = os.path.dirname(f)
        row = row_of(run_dir)
        if row is None:
            continue
        with open(f) as fh:
            r = json.load(fh)["result"]
        if row == "equal tokens":
            t = r["trainer"]
            least_warm[t] = min(least_warm.get(t, r["warm_s"]), r["warm_s"])
        r["drafter"] = here(r["drafter"], run_dir)
        r["curve"] = [(a, b, c, here(d, run_dir)) for a, b, c, d in r.get("curve", [])]
        r["row"] = row
        for d in [r["drafter"]] + [c[3] for c in r["curve"]]:
            got = kept_acceptance(d, method)
            if got is not None:
                measured[d] = got
        if r["drafter"] not in measured:
            if r["row"] != "equal wall":  # the wall runs not chosen were never measured
                missing.append(os.path.basename(run_dir))
            continue
        r["per_prompt"], r["same_as_greedy"] = measured[r["drafter"]]
        runs.append(r)
    # An equal-wall row pairs the run made again with the other trainer's equal-tokens run, at
    # that trainer's least time over its seeds (what the run was matched to, as quality.py does).
    for w in [r for r in runs if r["row"] == "equal wall"]:
        runs += [{**r, "row": "equal wall", "same_run": True, "own_warm_s": r["warm_s"],
                  "warm_s": least_warm[r["trainer"]]} for r in runs
                 if r["row"] == "equal tokens" and r["seed"] == w["seed"]
                 and r["trainer"] != w["trainer"]]  # fmt: skip
    floor = kept_acceptance(os.path.join(work, "init-0"), method)
    try:
        with open(os.path.join(work, "data", "quality-stage.json")) as f:
            data = json.load(f)["stats"]
    except (OSError, KeyError, ValueError):
        data = {}
    return runs, measured, floor, missing, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work", help="quality.py's --work directory (or a copy of it)")
    ap.add_argument("--json", help="write the table here")
    ap.add_argument("--size", default="collected", help="the size it ran at, for the title")
    ap.add_argument("--device", default="?", help="the device it ran on, for the title")
    ap.add_argument("--measure", choices=["decode", "replay"], default="decode",
                    help="the measurements to read: dflash decoding's or the replay's")
    args = ap.parse_args()
    runs, measured, floor, missing, data = collect(args.work, args.measure)
    if not runs:
        raise SystemExit(f"{args.work}: no measured runs (quality-run.json with an "
                         "acceptance-*.json beside its drafter)")  # fmt: skip
    if floor is None:
        raise SystemExit(f"{args.work}: the untrained init (init-0) was not measured")
    meta = {"size": args.size, "device": args.device, "cores": None,
            "eval_prompts": len(runs[0]["per_prompt"]),
            "seeds": sorted({r["seed"] for r in runs}), "data": data,
            "recipe": {"ours": next((r["setting"] for r in runs if r["trainer"] == "dflash-top"
                                     and r["row"] == "equal tokens"), None),
                       "specforge": next((r["setting"] for r in runs if r["trainer"] ==
                                          "specforge" and r["row"] == "equal tokens"), None)},
            "not_measured": missing, "measure_check": {"method": args.measure, "drafters": 0}}  # fmt: skip
    table = table_of(runs, floor[0], curves_of(runs, measured), meta)
    print_table(table)
    if missing:
        print(f"not measured: {', '.join(missing)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
