"""python/peer/quality_report.py run on its own: the table rebuilt from a quality.py work
directory that was cut off in the acceptance measurement, copied from another machine."""

import json
import os
import subprocess
import sys

from conftest import REPO

SCRIPT = os.path.join(REPO, "python", "peer", "quality_report.py")
OURS = {"seq_len": 1024, "anchors": 512, "budget": "per-row", "steps_per_batch": 2, "lr": 6e-4}
SF = {"batch": 1, "lr": 6e-4}
# Where the runs were made: the paths inside quality-run.json point there, not here.
ELSEWHERE = "/elsewhere/qw/q"


def run(q, name, trainer, setting, seed, drafter, curve=(), warm=5.0, tokens=1000):
    d = q / name
    d.mkdir(parents=True)
    result = {
        "trainer": trainer, "setting": setting, "seed": seed, "steps": 10,
        "target_tokens": tokens, "wall_s": warm + 1, "warm_s": warm,
        "tau": 1.5 if trainer == "dflash-top" else None,
        "drafter": f"{ELSEWHERE}/{name}{drafter}",
        "curve": [[s, x, t, f"{ELSEWHERE}/{name}{p}"] for s, x, t, p in curve],
    }  # fmt: skip
    (d / "quality-run.json").write_text(json.dumps({"key": "k", "result": result}))


def measured(path, per):
    path.mkdir(parents=True, exist_ok=True)
    (path / "acceptance-0123456789abcdef.json").write_text(
        json.dumps({"per_prompt": per, "same_as_greedy": 2})
    )


def test_the_table_from_the_measured_runs_of_a_cut_off_work_directory(tmp_path):
    q = tmp_path / "W" / "q"
    measured(q / "init-0", [1.0, 1.0, 1.0, 1.0])
    run(q, "ours-tokens-s0-aa", "dflash-top", OURS, 0, "/step-000010",
        curve=[(5, 500, 1.0, "/step-000005"), (10, 1000, 2.0, "/step-000010")])  # fmt: skip
    measured(q / "ours-tokens-s0-aa" / "step-000005", [1.1, 1.1, 1.2, 1.2])
    measured(q / "ours-tokens-s0-aa" / "step-000010", [1.5, 1.6, 1.4, 1.5])
    run(q, "sf-tokens-s0-bb", "specforge", SF, 0, "", warm=30.0)
    measured(q / "sf-tokens-s0-bb", [1.1, 1.2, 1.1, 1.2])
    # The first try at equal wall, not chosen, so never measured; the second, measured.
    run(q, "ours-wall0-s0-cc", "dflash-top", OURS, 0, "/step-000100", warm=20.0, tokens=9000)
    run(q, "ours-wall1-s0-dd", "dflash-top", OURS, 0, "/step-000150", warm=29.0, tokens=14000)
    measured(q / "ours-wall1-s0-dd" / "step-000150", [2.0, 2.0, 2.0, 2.0])
    # Seeds whose measurement the cut-off stopped; SpecForge's seed 1 ran faster than its first.
    run(q, "ours-tokens-s1-ee", "dflash-top", OURS, 1, "/step-000010")
    run(q, "sf-tokens-s1-ff", "specforge", SF, 1, "", warm=12.0)

    out = tmp_path / "q.json"
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "W"), "--json", str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "not measured: ours-tokens-s1-ee, sf-tokens-s1-ff" in r.stdout
    t = json.loads(out.read_text())
    assert t["not_measured"] == ["ours-tokens-s1-ee", "sf-tokens-s1-ff"]
    rows = {(x["row"], x["trainer"]): x for x in t["rows"]}
    assert rows[("floor", "untrained init")]["acceptance"] == 1.0
    assert abs(rows[("equal tokens", "dflash-top")]["acceptance"] - 1.5) < 1e-9
    wall_sf = rows[("equal wall", "specforge")]
    # The equal-wall row sets ours against SpecForge's least time over its seeds, as it was
    # matched; its own run's time is kept beside it.
    assert wall_sf["same_run"] and wall_sf["warm_s"] == 12.0
    assert t["runs"][-1]["own_warm_s"] == 30.0
    assert rows[("equal wall", "dflash-top")]["target_tokens"] == 14000
    paired = {p["row"]: p for p in t["paired"]}
    assert abs(paired["equal tokens"]["mean"] - (1.5 - 1.15)) < 1e-9
    assert paired["equal tokens"]["n"] == 4
    assert abs(paired["equal wall"]["mean"] - (2.0 - 1.15)) < 1e-9
    (curve,) = t["curves"]
    assert [p["target_tokens"] for p in curve["points"]] == [500, 1000]
    assert abs(curve["points"][0]["acceptance"] - 1.15) < 1e-9


def test_a_work_directory_with_nothing_measured_is_refused_with_its_name(tmp_path):
    q = tmp_path / "W" / "q"
    run(q, "ours-tokens-s0-aa", "dflash-top", OURS, 0, "/step-000010")
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "W")],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0
    assert str(tmp_path / "W") in r.stderr and "no measured runs" in r.stderr
    assert "Traceback" not in r.stderr
