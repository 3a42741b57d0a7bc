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
        assert set(s["m"]) == {"step", "loss"}, "the loss backward() took, no number made up"
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

    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "dflash_top", "run", *a], env=env, capture_output=True,
            text=True, timeout=120,
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
    monkeypatch.setattr(sys.modules["dflash_top.auto.session"], "SETTLE_STEPS", 5)
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


def test_settling_inside_a_nested_module_keeps_the_forwards_counted(auto):
    """The global hooks give way (settle, run by whichever thread ends the 50th step) while
    another thread is inside a nested module: that module's global post hook never comes. The
    thread's top-level forward must still end, and its later forwards still count tokens."""
    a, c = auto
    settle = a._settle

    class Inner(torch.nn.Module):
        def forward(self, x):
            if a._settle is not None:  # the first call: settle from inside, as another thread may
                a._settle = None
                settle()
            return x + 1

    class Top(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, input_ids):
            return self.inner(input_ids.float())

    def trainer():
        model = Top()
        for _ in range(4):
            model(torch.zeros(2, 8, dtype=torch.long))

    t = threading.Thread(target=trainer, name="trainer")
    t.start()
    t.join(60)
    tid = [m["id"] for m in c.declared if m["t"] == "thread" and m["name"] == "trainer"][0]
    steps = [m for m in c.steps() if m["th"] == tid]
    # Four forwards, four steps of 16 tokens each: the first (settled inside) and the three after.
    assert [s.get("tok", 0) for s in steps] == [16, 16, 16, 16], steps


def dict_trainer(steps=6, device="cpu"):
    """A loader thread putting dict batches ({"input_ids", "labels"}) into a queue.Queue, and a
    trainer thread taking them: a model called with the whole batch, backward on its loss,
    an optimizer step. Returns the losses the trainer computed, in order."""
    q = queue.Queue(maxsize=2)
    losses = []

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 8)
            self.out = torch.nn.Linear(8, 100)

        def forward(self, batch):
            logits = self.out(self.emb(batch["input_ids"]))
            return torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten()
            )

    def loader():
        for i in range(steps):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 100, (2, 12), generator=g).to(device)
            q.put({"input_ids": ids, "labels": ids.roll(1, 1)})

    def trainer():
        model = LM().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        kept = []
        for _ in range(steps):
            loss = model(q.get())
            loss.backward()
            opt.step()
            opt.zero_grad()
            kept.append(loss.detach())
        losses.extend(float(x) for x in kept)  # after the loop: no sync inside it

    threads = [threading.Thread(target=loader, name="loader"),
               threading.Thread(target=trainer, name="trainer")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return losses


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="the pinned, non-blocking copy needs a GPU"))],
)
def test_tokens_of_a_dict_batch_and_the_loss_one_step_late_without_a_sync(auto, device):
    a, c = auto
    losses = dict_trainer(steps=6, device=device)
    threads = {m["name"]: m["id"] for m in c.declared if m["t"] == "thread"}
    steps = [m for m in c.steps() if m["th"] == threads["trainer"]]
    # Its forward took the whole batch: the batch's input_ids are its tokens, all of them.
    assert sum(s.get("tok", 0) for s in steps) == 6 * 24, steps
    # Steps end at the optimizer's (the first one at its forward, before one was seen).
    opt = [s for s in steps if "m" in s]
    assert [s["m"]["step"] for s in opt] == [1, 2, 3, 4, 5, 6]
    # Each step carries the loss of the step before it (read when its copy was done).
    assert "loss" not in opt[0]["m"]
    # (On a GPU, a step's record may carry none where its copy was not done yet: never waited for.)
    shown = [(s["m"]["step"], s["m"].get("loss")) for s in opt[1:]]
    assert all(v is None or v == pytest.approx(losses[k - 2], rel=1e-6) for k, v in shown), shown
    assert sum(v is not None for _, v in shown) >= (5 if device == "cpu" else 1), shown
    # Reading it was no host sync of the script's.
    idx = {p: k for k, p in enumerate(a.stages[0]["phases"])}
    assert all(idx["sync"] not in dict(s.get("n", [])) for s in steps), steps
    assert not any("loss" in s.get("m", {}) for s in c.steps() if s["th"] == threads["loader"])
    # The trainer, whose steps bring the tokens, is the last stage (where the viewer counts).
    assert a.stages[-1]["name"] == "trainer"


def test_host_syncs_are_kept_by_call_site_with_their_op_count_and_time(auto):
    a, c = auto
    x = torch.arange(6.0)

    def loop():
        model = torch.nn.Linear(6, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            loss = model(x).sum()
            loss.backward()
            opt.step()
            loss.item()  # the known site
            for _ in range(2):
                x.tolist()

    t = threading.Thread(target=loop, name="trainer")
    t.start()
    t.join(60)
    import inspect

    src, first = inspect.getsourcelines(loop)
    line = first + next(i for i, s in enumerate(src) if "the known site" in s)
    (entry,) = [e for e in a._sample()["live"] if "sites" in e]
    # Named as from the working directory.
    sites = {(os.path.basename(s[0]), s[1]): s[2:] for s in entry["sites"]}
    assert entry["sites"][0][0].startswith(os.path.relpath(__file__)), entry
    here = os.path.basename(__file__)
    assert sites[("%s:%d" % (here, line), ".item()")][0] == 5, sites
    assert sites[("%s:%d" % (here, line + 2), ".tolist()")][0] == 10, sites
    assert all(ns > 0 for _, ns in sites.values())
    # Nothing of torch's own or ours is named a site.
    assert all(k[0].startswith(here) for k in sites), sites


def test_sites_are_bounded_the_rest_summed_as_other():
    from dflash_top import sites

    kept = {}
    import sys as _sys

    frame = _sys._getframe()
    for i in range(sites.MAX_KEPT + 50):
        kept[(frame.f_code, i, ".item()")] = [1, i]
    sites.note(kept, frame, ".cpu()", 7)
    rows = sites.top(kept)
    assert len(rows) == sites.TOP + 1
    assert rows[-1][0] == "other" and rows[-1][2] == sites.MAX_KEPT + 51 - sites.TOP
    assert rows[0][3] == sites.MAX_KEPT + 49, "the costliest first"


def test_dataloader_worker_processes_are_told_and_record_nothing_themselves(auto):
    a, c = auto
    data = torch.utils.data.TensorDataset(torch.randint(0, 9, (16, 4)))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)

    def loop():
        for (x,) in loader:
            x.sum().item()

    t = threading.Thread(target=loop, name="trainer")
    t.start()
    t.join(60)
    told = [m["text"] for m in c.declared if m["t"] == "status"]
    assert told == [
        "trainer's DataLoader runs 2 worker processes: their CPU is theirs, not this session's "
        "(not shown); the wait for their batches is trainer's data_wait"
    ], told
    # The workers (forked children) declared no thread of theirs into this session.
    assert [m["name"] for m in c.declared if m["t"] == "thread"] == ["trainer"]


def test_run_keeps_the_scripts_exit_status_traceback_and_socket_rules(tmp_path):
    runtime = tmp_path / "rt"
    runtime.mkdir()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, XDG_RUNTIME_DIR=str(runtime),
               DFLASH_TOP_QUIET="1")
    cases = {
        "exit3.py": "import sys\nprint('before')\nsys.exit(3)\n",
        "raises.py": "def f():\n    raise ValueError('boom')\n\n\nf()\n",
        "forks.py": (
            "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.exit(0)\n"
            "os.waitpid(pid, 0)\nimport glob\n"
            "print(len(glob.glob(os.path.join(os.environ['XDG_RUNTIME_DIR'], 'dflash-top', "
            "'*.sock'))))\n"
        ),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)

    def both(name):
        plain = subprocess.run([sys.executable, str(tmp_path / name)], env=env,
                               capture_output=True, text=True, timeout=120)
        run = subprocess.run([sys.executable, "-m", "dflash_top", "run", str(tmp_path / name)],
                             env=env, capture_output=True, text=True, timeout=120)
        return plain, run

    plain, run = both("exit3.py")
    assert (run.returncode, run.stdout) == (3, "before\n") == (plain.returncode, plain.stdout)
    plain, run = both("raises.py")
    assert run.returncode == plain.returncode == 1
    assert run.stderr == plain.stderr, "the script's own traceback, nothing of ours"
    plain, run = both("forks.py")
    assert run.returncode == 0 and run.stdout == "1\n", "the child left the parent's socket"
    missing = str(tmp_path / "missing.py")
    plain = subprocess.run([sys.executable, missing], env=env, capture_output=True, text=True)
    run = subprocess.run([sys.executable, "-m", "dflash_top", "run", missing], env=env,
                         capture_output=True, text=True)
    assert (run.returncode, run.stderr) == (plain.returncode, plain.stderr) == (2, plain.stderr)
    assert os.listdir(runtime / "dflash-top") == [], "every socket and stats file removed"
