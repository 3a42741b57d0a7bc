"""python/peer/quality_pair.py: two quality.py tables' dflash-top drafters paired by seed and
held-out prompt (how `--ours-target-precision fp8` was set against the default)."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "python", "peer", "quality_pair.py")


def table(per_seed, trainer="dflash-top", row="equal tokens"):
    runs = [{"trainer": trainer, "row": row, "seed": s, "per_prompt": p}
            for s, p in per_seed.items()]  # fmt: skip
    # A SpecForge run and another row are in real tables too: neither may be paired.
    runs.append({"trainer": "specforge", "row": row, "seed": 0, "per_prompt": [9.0, 9.0]})
    runs.append({"trainer": trainer, "row": "sweep", "seed": 0, "per_prompt": [7.0, 7.0]})
    return {"runs": runs}


def pair(tmp_path, base, other):
    paths = []
    for name, t in (("a.json", base), ("b.json", other)):
        (tmp_path / name).write_text(json.dumps(t))
        paths.append(str(tmp_path / name))
    return subprocess.run([sys.executable, SCRIPT, *paths], capture_output=True, text=True)


def test_the_difference_is_paired_by_seed_and_prompt(tmp_path):
    base = table({0: [1.0, 2.0], 1: [1.5, 1.0], 2: [3.0, 3.0]})
    # Seed 2 only in the base: left out. Differences +0.1, -0.1, +0.3, +0.1: mean +0.1.
    other = table({0: [1.1, 1.9], 1: [1.8, 1.1]})
    r = pair(tmp_path, base, other)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout.strip().splitlines()[-1])
    assert p["seeds"] == [0, 1] and p["n"] == 4
    assert abs(p["mean"] - 0.1) < 1e-9
    assert abs(p["base"] - 1.375) < 1e-9 and abs(p["other"] - 1.475) < 1e-9
    assert p["ci_low"] < 0.1 < p["ci_high"]


def test_tables_of_other_prompts_are_refused(tmp_path):
    r = pair(tmp_path, table({0: [1.0, 2.0]}), table({0: [1.0, 2.0, 3.0]}))
    assert r.returncode != 0
    assert "not the same held-out prompts" in r.stderr
    r = pair(tmp_path, table({0: [1.0]}), table({1: [1.0]}))
    assert r.returncode != 0
    assert "no seed" in r.stderr
