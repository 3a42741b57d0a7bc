"""python/peer/plot_seq.py: the rows it reads from compare.py's JSON and the picture it draws."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = os.path.join(REPO, "python", "peer", "plot_seq.py")


def load():
    spec = importlib.util.spec_from_file_location("plot_seq", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(seq, ours, sf):
    return {"preset": "qwen3-8b", "batch": 1, "seq": seq, "ours": ours, "specforge": sf}


def test_rows_by_length_with_failures_apart(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [
        row(8192, {"tok_per_s": 12.0, "peak_allocated_gib": 40.0}, {"error": "out of memory"}),
        row(3072, {"tok_per_s": 15.0, "peak_allocated_gib": 30.0},
            {"tok_per_s": 9.0, "peak_allocated_gib": 31.0})]}))
    # A later file's row for the same length replaces the earlier one.
    b.write_text(json.dumps({"rows": [
        row(8192, {"tok_per_s": 13.0, "peak_allocated_gib": 41.0}, {"error": "out of memory"})]}))
    m = load()
    rows = m.read_rows([str(a), str(b)])
    assert [r["seq"] for r in rows] == [3072, 8192]
    assert m.series(rows, "ours", "tok_per_s") == ([(3072, 15.0), (8192, 13.0)], [])
    assert m.series(rows, "specforge", "tok_per_s") == ([(3072, 9.0)], [8192])
    assert m.series(rows, "python", "tok_per_s") == ([], [])


def test_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "run.json"
    src.write_text(json.dumps({"rows": [
        row(3072, {"tok_per_s": 15.0, "peak_allocated_gib": 30.0}, {"error": "oom"})]}))
    out = tmp_path / "seq.png"
    subprocess.run([sys.executable, SCRIPT, str(out), str(src)], check=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"rows": []}))
    p = subprocess.run([sys.executable, SCRIPT, str(out), str(empty)], capture_output=True,
                       text=True)
    assert p.returncode != 0 and "no rows" in p.stderr
