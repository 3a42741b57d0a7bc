"""`pip install ./python` into a fresh venv, then `import dflash_top` there without PYTHONPATH
and from a directory outside the repository; and the example runs from the source tree."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

from conftest import PYTHON_DIR

import dflash_top


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, **kw)
    assert p.returncode == 0, "%s\n%s\n%s" % (" ".join(cmd), p.stdout, p.stderr)
    return p.stdout


def can_build_offline(py):
    """Whether the venv's own setuptools builds wheels (>= 70.1, or with `wheel`): then no
    build dependency is fetched."""
    code = textwrap.dedent(
        """
        import importlib.util, setuptools
        v = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
        print(v >= (70, 1) or importlib.util.find_spec("wheel") is not None)
        """
    )
    p = subprocess.run([py, "-c", code], capture_output=True, text=True, env=clean_env())
    return p.stdout.strip() == "True"


def test_pip_install_into_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if can_build_offline(py):
        pip += ["--no-build-isolation", "--no-index"]
    # Otherwise pip fetches the build backend (setuptools) from the package index.
    # setuptools builds in the tree (python/build, python/dflash_top.egg-info): removed before
    # (a stale build could carry modules since removed) and after.
    outputs = [os.path.join(PYTHON_DIR, d) for d in ("build", "dflash_top.egg-info")]
    for d in outputs:
        shutil.rmtree(d, ignore_errors=True)
    try:
        run(pip + [PYTHON_DIR], env=clean_env())
    finally:
        for d in outputs:
            shutil.rmtree(d, ignore_errors=True)
    probe = textwrap.dedent(
        """
        import importlib.metadata, json, os, sys
        import dflash_top
        from dflash_top import Profiler, ProfiledQueue, PROTOCOL_VERSION
        here = os.path.dirname(dflash_top.__file__)
        p = Profiler([("w", ["a"])], serve=False)
        print(json.dumps({
            "file": dflash_top.__file__,
            "prefix": sys.prefix,
            "version": dflash_top.__version__,
            "dist": importlib.metadata.version("dflash-top"),
            "protocol": PROTOCOL_VERSION,
            "files": sorted(
                os.path.relpath(os.path.join(d, f), here)
                for d, _, fs in os.walk(here) if "__pycache__" not in d for f in fs
            ),
            "all": dflash_top.__all__,
        }))
        """
    )
    out = json.loads(run([py, "-c", probe], cwd=str(tmp_path), env=clean_env()))
    assert out["file"].startswith(os.path.join(out["prefix"], "lib")), out["file"]
    assert out["version"] == out["dist"] == dflash_top.__version__
    assert out["protocol"] == dflash_top.PROTOCOL_VERSION
    package = os.path.dirname(dflash_top.__file__)
    source = [
        os.path.relpath(os.path.join(d, f), package)
        for d, _, fs in os.walk(package)
        for f in fs
        if f.endswith(".py")
    ]
    assert out["files"] == sorted(source + ["py.typed"]), "sub-packages in pyproject.toml?"
    assert out["all"] == dflash_top.__all__
    # Zero-code mode from the install, in a venv without torch (the queue wraps only).
    script = tmp_path / "plain.py"
    script.write_text(
        "import queue, sys, threading\n"
        "q = queue.Queue(1)\n"
        "t = threading.Thread(target=lambda: [q.put(i) for i in range(50)], name='producer-0')\n"
        "t.start()\n"
        "print(sum(q.get() for _ in range(50)), sys.argv[1:])\n"
        "t.join()\n"
    )
    out = run(
        [py, "-m", "dflash_top", "run", str(script), "x"],
        cwd=str(tmp_path),
        env=clean_env(XDG_RUNTIME_DIR=str(tmp_path)),
    )
    assert out.strip() == "1225 ['x']"


def test_example_runs_from_the_source_tree_without_an_install(tmp_path):
    example = os.path.join(PYTHON_DIR, "examples", "pipeline.py")
    out = run(
        [sys.executable, "-S", example, "--seconds", "0.3", "--no-torch"],
        cwd=str(tmp_path),
        env=clean_env(XDG_RUNTIME_DIR=str(tmp_path)),
    )
    assert "serving on %s" % os.path.join(str(tmp_path), "dflash-top") in out
    assert os.listdir(os.path.join(str(tmp_path), "dflash-top")) == []  # socket removed
