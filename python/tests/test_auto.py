"""Zero-code mode: PyTorch's hooks and a few wraps become threads, stages, queues, phases and
steps with no change to the script; `python -m dflash_top run` runs a script that way."""

import os
import queue
import subprocess
import sys
import threading

import pytest

from conftest import PYTHON_DIR, Captured

torch = pytest.importorskip("torch")

from dflash_top.auto import Auto, stage_of  # noqa: E402


@pytest.fixture
def auto():
    """An Auto with its hooks installed and its sends captured; hooks removed after."""
    a = Auto(serve=False)
    c = Captured()
    a._server = c
    a.install()
    yield a, c
    a._server = None
    a.close()


def test_threads_group_into_stages_by_name():
    assert stage_of("target-0") == "target"
    assert stage_of("target-1") == "target"
    assert stage_of("drafter_2") == "drafter"
    assert stage_of("MainThread") == "main"
    assert stage_of("Thread-3 (worker)") == "worker"
    assert stage_of("Thread-7") == "thread"
    assert stage_of("loader") == "loader"


def pipeline(steps=6):
    """A target thread (an embedding of token ids) feeding a drafter thread (a small model,
    AdamW-free SGD, clipping, one .item() a step) through a queue.Queue."""
    q = queue.Queue(maxsize=2)
    emb = torch.nn.Embedding(100, 16)

    def target():
        for _ in range(steps):
            with torch.no_grad():
                h = emb(torch.randint(0, 100, (2, 8)))
            q.put(h)

    def drafter():
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(steps):
            h = q.get()
            loss = model(h).pow(2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            loss.item()

    # The drafter starts first (it registers first); the chain still puts the target upstream.
    threads = [threading.Thread(target=drafter, name="drafter-0")]
    threads.append(threading.Thread(target=target, name="target-0"))
    for t in threads:
        t.start()
        if t.name == "drafter-0":
            t.join(0.2)
    for t in threads:
        t.join(60)


def test_an_unmodified_pipeline_becomes_stages_queues_phases_and_steps(auto):
    a, c = auto
    pipeline()
    assert [s["name"] for s in a.stages] == ["target", "drafter"]
    phases = a.stages[0]["phases"]
    assert a.stages[1]["phases"] == phases, "one shared list: a phase keeps its index"
    for p in ["pop_wait", "push_wait", "backward", "clip", "optim", "sync", "Embedding",
              "Sequential"]:
        assert p in phases
    threads = {m["name"]: m for m in c.declared if m["t"] == "thread"}
    assert threads["target-0"]["stage"] == "target"
    assert threads["drafter-0"]["stage"] == "drafter"
    (q,) = [m for m in c.declared if m["t"] == "queue"]
    assert (q["producer"], q["consumer"], q["capacity"]) == ("target", "drafter", 2)
    # Each growth of the table went to the viewers as a new hello.
    hellos = [m for m in c.controls if m["t"] == "hello"]
    assert [s["name"] for s in hellos[-1]["stages"]["stages"]] == ["target", "drafter"]

    d = threads["drafter-0"]["id"]
    # A step ends at the optimizer's step (the first one at its forward, before one was seen).
    steps = [m for m in c.steps() if m["th"] == d and "m" in m]
    assert len(steps) == 6, "a drafter step ends at each optimizer step"
    assert [s["m"]["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    idx = {p: k for k, p in enumerate(phases)}
    for s in steps[1:]:
        ph = dict(s["ph"])
        for p in ["backward", "optim", "Sequential"]:
            assert ph.get(idx[p], 0) > 0, (p, s)
        # The previous step's .item() (after the optimizer's step) is counted in this one.
        assert dict(s["n"]) == {idx["sync"]: 1}, s
        assert s["tok"] == 16, "the target's 2x8 token ids travel with its items"
        assert s["m"] == {"step": s["m"]["step"]}, "no training number made up"
    t = threads["target-0"]["id"]
    tsteps = [m for m in c.steps() if m["th"] == t]
    assert any(dict(s["ph"]).get(idx["Embedding"], 0) > 0 for s in tsteps)
    sample = a._sample()
    assert sample["q"][0]["push"] == sample["q"][0]["pop"] == 6


def test_a_dataloader_wait_and_host_syncs_are_phases_of_their_own(auto):
    a, c = auto
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def loop():
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            y.tolist()

    t = threading.Thread(target=loop, name="trainer")
    t.start()
    t.join(60)
    idx = {p: k for k, p in enumerate(a.stages[0]["phases"])}
    # Steps end at the optimizer's step (the first one at the forward, before one was seen).
    steps = [s for s in c.steps() if "m" in s]
    assert len(steps) == 4
    for s in steps[1:]:
        assert dict(s["ph"]).get(idx["data_wait"], 0) > 0, s
    assert dict(steps[-1]["n"]) == {idx["sync"]: 2}


def test_close_removes_every_hook(auto):
    a, _ = auto
    assert hasattr(torch.Tensor.item, "__wrapped__")
    assert queue.Queue.put.__qualname__ != "Queue.put"
    a.close()
    assert not hasattr(torch.Tensor.item, "__wrapped__")
    assert "item" not in torch.Tensor.__dict__, "the inherited method is back"
    assert not hasattr(torch.Tensor.backward, "__wrapped__")
    assert queue.Queue.put.__qualname__ == "Queue.put"
    from torch.nn.modules import module

    assert not module._global_forward_hooks and not module._global_forward_pre_hooks


def test_python_m_dflash_top_run_runs_a_script_with_its_arguments(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, queue, torch\n"
        "assert hasattr(torch.Tensor.item, '__wrapped__'), 'instrumented'\n"
        "assert queue.Queue.put.__qualname__ != 'Queue.put'\n"
        "print('args', sys.argv[1:], __name__)\n"
    )
    runtime = tmp_path / "rt"
    runtime.mkdir()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, XDG_RUNTIME_DIR=str(runtime))
    out = subprocess.run(
        [sys.executable, "-m", "dflash_top", "run", str(script), "--steps", "3"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "args ['--steps', '3'] __main__" in out.stdout
    assert "dflash-top attach" in out.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "dflash_top", "walk"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_run_starts_cuda_threads_in_the_timing_asked_for(tmp_path):
    script = tmp_path / "timing.py"
    script.write_text("import dflash_top\nprint('timing', dflash_top.auto().gpu_timing)\n")
    runtime = tmp_path / "rt"
    runtime.mkdir()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, XDG_RUNTIME_DIR=str(runtime))
    run = lambda *a: subprocess.run(
        [sys.executable, "-m", "dflash_top", "run", *a], env=env, capture_output=True, text=True,
        timeout=120,
    )
    for flag in (["--gpu-timing", "events"], ["--gpu-timing=events"]):
        out = run(*flag, str(script))
        assert out.returncode == 0, out.stderr
        assert "timing Events" in out.stdout
    assert "timing Async" in run(str(script)).stdout, "async unless asked"
    bad = run("--gpu-timing", "fast", str(script))
    assert bad.returncode == 2 and "--gpu-timing 'fast': use async, sync or events" in bad.stderr


def test_after_settling_only_the_top_level_modules_keep_hooks(auto, monkeypatch):
    a, c = auto
    mod = sys.modules["dflash_top.auto"]
    monkeypatch.setattr(mod, "SETTLE_STEPS", 5)
    from torch.nn.modules import module

    pipeline(steps=12)
    assert not module._global_forward_pre_hooks and not module._global_forward_hooks
    idx = {p: k for k, p in enumerate(a.stages[0]["phases"])}
    d = [m["id"] for m in c.declared if m["t"] == "thread" and m["name"] == "drafter-0"][0]
    last = [m for m in c.steps() if m["th"] == d][-1]
    assert dict(last["ph"]).get(idx["Sequential"], 0) > 0, "its forward still timed: %s" % last
    t = [m["id"] for m in c.declared if m["t"] == "thread" and m["name"] == "target-0"][0]
    tlast = [m for m in c.steps() if m["th"] == t][-1]
    assert dict(tlast["ph"]).get(idx["Embedding"], 0) > 0, tlast
