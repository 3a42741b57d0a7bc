"""Two quality.py tables' dflash-top drafters, paired: the same seeds and held-out prompts, the
second table's acceptance minus the first's, with its 95% interval. For a setting that the
harness cannot run side by side with the other in one table (e.g. `--ours-target-precision fp8`
against the default), run quality.py twice in one --work directory, then:

  python3 python/peer/quality_pair.py BASE.json OTHER.json [--row "equal tokens"]
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quality_report import mean_ci  # noqa: E402


def per_seed(table, row):
    """{seed: per-prompt acceptance} of the table's dflash-top runs in `row`."""
    runs = [r for r in table["runs"] if r["trainer"] == "dflash-top" and r["row"] == row]
    return {r["seed"]: r["per_prompt"] for r in runs}


def pair(base, other, row="equal tokens"):
    a, b = per_seed(base, row), per_seed(other, row)
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise SystemExit(f"no seed has a dflash-top run in row `{row}` of both tables")
    for s in seeds:
        if len(a[s]) != len(b[s]):
            raise SystemExit(f"seed {s}: {len(a[s])} prompts in one table, {len(b[s])} in the "
                             "other: not the same held-out prompts")  # fmt: skip
    d = [y - x for s in seeds for x, y in zip(a[s], b[s])]
    m, lo, hi = mean_ci(d)
    mean = lambda t: sum(x for s in seeds for x in t[s]) / len(d)  # noqa: E731
    return {"row": row, "seeds": seeds, "n": len(d), "base": mean(a), "other": mean(b),
            "mean": m, "ci_low": lo, "ci_high": hi}  # fmt: skip


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", help="quality.py's JSON of the reference setting")
    ap.add_argument("other", help="quality.py's JSON of the setting compared with it")
    ap.add_argument("--row", default="equal tokens")
    args = ap.parse_args()
    tables = [json.load(open(p)) for p in (args.base, args.other)]
    p = pair(*tables, row=args.row)
    print(f"{p['row']}, seeds {p['seeds']}, {p['n']} (seed, prompt) pairs: base {p['base']:.3f}, "
          f"other {p['other']:.3f}, other - base {p['mean']:+.3f} "
          f"[{p['ci_low']:+.3f}, {p['ci_high']:+.3f}]")
    print(json.dumps(p))


if __name__ == "__main__":
    main()
