"""The profiler records marks and steps per thread, sends what it was given and nothing more,
and speaks the protocol to a real viewer on its socket."""

import os
import queue
import socket
import threading
import time

import pytest

from conftest import Viewer, in_thread
from test_protocol_constants import PROTOCOL_RS, rust_message_fields

import dflash_top
from dflash_top import Profiler, profiler


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self):
        self.t = 1_000

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(profiler, "_mono", c)
    return c


def test_stage_table_gets_queue_waits_by_position():
    p = Profiler(["loader", ("target", ["forward"]), ("drafter", ["forward", "loss"])], serve=False)
    assert p.stages == [
        {"name": "loader", "phases": ["push_wait"]},
        {"name": "target", "phases": ["pop_wait", "forward", "push_wait"]},
        {"name": "drafter", "phases": ["pop_wait", "forward", "loss"]},
    ]
    with pytest.raises(ValueError, match="at least one stage"):
        Profiler([], serve=False)


def test_marks_and_steps_are_recorded(captured, clock):
    p, c = captured([("worker", ["a", "b"])])

    def work():
        p.thread("worker")
        clock.t += 5  # other
        p.mark("a")
        clock.t += 20
        p.mark("b")
        clock.t += 30
        p.mark("a")
        clock.t += 7
        p.end_step(tokens=64)
        clock.t += 100
        p.mark("b")
        clock.t += 11
        p.end_step()

    in_thread(work)
    (decl,) = c.declared
    assert decl["t"] == "thread" and decl["stage"] == "worker" and decl["name"] == "worker"
    assert decl["device"] == "cpu" and decl["tid"] > 0
    s1, s2 = c.steps()
    assert s1["ph"] == [[0, 27], [1, 30]]  # a, b; `other` (5) is the rest of wall
    assert s1["wall"] == 62 and s1["end"] == 1_062 and s1["tok"] == 64
    assert s1["prof"] is True and s1["timing"] == "Host" and s1["th"] == 0
    # The next step starts at the end of the last, in `other`.
    assert s2["ph"] == [[1, 11]] and s2["wall"] == 111
    assert "tok" not in s2  # no tokens given: left out (the protocol's default is 0)


def test_phase_context_restores_the_previous_phase(captured, clock):
    p, c = captured([("worker", ["outer", "inner"])])

    def work():
        p.thread("worker")
        with p.phase("outer"):
            clock.t += 10
            with p.phase("inner"):
                clock.t += 3
            clock.t += 4
        clock.t += 1
        p.end_step()

    in_thread(work)
    (s,) = c.steps()
    assert s["ph"] == [[0, 14], [1, 3]] and s["wall"] == 18


def test_undeclared_names_are_named_in_the_error(captured):
    p, _ = captured([("worker", ["a"])])
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        in_thread(lambda: p.thread("nope"))

    def work():
        p.thread("worker")
        p.mark("zap")

    with pytest.raises(ValueError, match="phase 'zap' is not declared for stage 'worker'"):
        in_thread(work)


def test_unregistered_threads_and_profiling_off_cost_nothing(captured, clock):
    p, c = captured([("worker", ["a"])])
    p.mark("a")  # this thread never registered: ignored
    p.end_step()
    assert c.steps() == []

    def work():
        p.thread("worker")
        p._command({"cmd": "set_profiling", "value": False})
        p.mark("a")
        clock.t += 10
        p.end_step()
        p._command({"cmd": "set_profiling", "value": True})
        clock.t += 10
        p.mark("a")
        clock.t += 10
        p.end_step()

    in_thread(work)
    off, mixed = c.steps()
    assert off["ph"] == [] and off["prof"] is False
    # Profiling switched back on mid-step: that step's phases are not the whole step.
    assert mixed["prof"] is False and mixed["ph"] == [[0, 10]]


def test_values_never_given_are_absent_not_zero(captured):
    p, c = captured([("worker", ["a"])])

    def work():
        p.thread("worker")
        p.end_step()
        p.end_step(tokens=8, loss=2.5)
        p.end_step(loss=2.0, lr=3e-4)
        p.end_step(tau=3.25, grad_norm=0.5, step=41)
        p.end_step(loss=float("nan"), lr=1e-4)

    in_thread(work)
    bare, loss_only, loss_lr, no_loss, nan = c.steps()
    assert "m" not in bare
    assert loss_only["m"] == {"loss": 2.5, "step": 1}
    assert loss_lr["m"] == {"loss": 2.0, "lr": 3e-4, "step": 2}
    assert no_loss["m"] == {"tau": 3.25, "grad_norm": 0.5, "step": 41}
    assert nan["m"] == {"lr": 1e-4, "step": 3}  # NaN is not JSON: left out, not sent as 0
    for s in c.steps():
        for k in ("tau", "lr", "grad_norm", "loss"):
            assert s.get("m", {}).get(k) != 0, (k, s)
    # Nor does a sample make any up: it carries timing and queue counters only.
    sample = p._sample()
    assert set(sample) == {"t", "now", "prof", "timing", "paused", "dropped", "live", "q"}


def until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.001)


def test_queue_waits_show_as_the_stage_phases(captured):
    p, c = captured([("producer", ["make"]), ("consumer", ["train"])])
    q = p.queue(queue.Queue(maxsize=1), "batches")
    (qd,) = c.declared
    assert qd == {"t": "queue", "id": 0, "name": "batches", "capacity": 1,
                  "producer": "producer", "consumer": "consumer"}

    def consumer():
        p.thread("consumer")
        assert q.get() == "x"  # waits on the empty queue: pop_wait
        until(lambda: q._counts.pushers[0] == 1)  # the producer is blocked on the full queue
        p.mark("train")
        time.sleep(0.02)
        p.end_step()
        assert [q.get(), q.get()] == ["y", "z"]

    t = threading.Thread(target=in_thread, args=(consumer, "consumer"))
    t.start()

    def producer():
        p.thread("producer")
        until(lambda: q._counts.poppers[0] == 1)  # the consumer waits
        with p.phase("make"):
            time.sleep(0.02)
        q.put("x")
        q.put("y")
        q.put("z")  # waits until the consumer takes "y": push_wait
        p.end_step()

    in_thread(producer, "producer")
    t.join()
    stage = {d["id"]: d["stage"] for d in c.declared if d["t"] == "thread"}
    ph = {stage[s["th"]]: dict(map(tuple, s["ph"])) for s in c.steps()}
    # consumer: pop_wait (0), train (1); producer: make (0), push_wait (1).
    assert ph["consumer"][0] >= 20_000_000 and ph["consumer"][1] >= 20_000_000
    assert ph["producer"][0] >= 20_000_000 and ph["producer"][1] >= 20_000_000


def test_queue_reports_depth_and_counts():
    p = Profiler([("a", []), ("b", [])], serve=False)
    q = p.queue(queue.Queue(), "unbounded")
    for i in range(3):
        q.put(i)
    r = q._read(0, time.monotonic_ns())
    assert (r["depth"], r["push"], r["pop"], r["min"], r["max"]) == (3, 3, 0, 0, 3)
    assert q.qsize() == 3 and not q.empty() and not q.full()
    time.sleep(0.002)
    assert q.get_nowait() == 0
    r = q._read(0, time.monotonic_ns())
    assert (r["depth"], r["pop"], r["min"], r["max"]) == (2, 1, 2, 3)
    assert r["age_sum"] >= 2_000_000 and r["depth_ns"] > 0 and r["empty"] > 0
    q.get(), q.get()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)
    r = q._read(0, time.monotonic_ns())
    assert r["depth"] == 0 and r["pop_wait"] >= 10_000_000
    full = p.queue(queue.Queue(maxsize=1), "one")
    full.put(1)
    with pytest.raises(queue.Full):
        full.put_nowait(2)
    assert full.full()


def test_frames_to_a_real_viewer_match_the_rust_messages(short_dir):
    path = os.path.join(short_dir, "p.sock")
    p = Profiler([("producer", ["make"]), ("consumer", ["train"])], path=path)
    try:
        assert p.path == path and oct(os.stat(path).st_mode & 0o777) == "0o600"
        q = p.queue(queue.Queue(maxsize=4), "batches")
        v = Viewer(path)
        assert v.theirs == dflash_top.wire.preamble()
        stop = threading.Event()

        def producer():
            p.thread("producer")
            while not stop.is_set():
                with p.phase("make"):
                    time.sleep(0.005)
                try:
                    q.put(1, timeout=0.05)
                except queue.Full:
                    pass
                p.end_step()

        def consumer():
            p.thread("consumer")
            while not stop.is_set():
                try:
                    q.get(timeout=0.05)
                except queue.Empty:
                    continue
                p.mark("train")
                time.sleep(0.01)
                p.end_step(tokens=16, loss=1.25)

        ts = [threading.Thread(target=producer, name="producer"),
              threading.Thread(target=consumer, name="consumer")]
        for t in ts:
            t.start()
        try:
            (hello,) = v.wait_for(lambda f: f["t"] == "hello")
            v.wait_for(lambda f: f["t"] == "step" and "m" in f)
            samples = v.wait_for(lambda f: f["t"] == "sample" and f["q"] and f["q"][0]["push"] > 2)
            # A command from the viewer reaches the profiler.
            v.send({"t": "command", "cmd": {"cmd": "set_paused", "value": True}})
            deadline = time.monotonic() + 5
            while not p.paused and time.monotonic() < deadline:
                time.sleep(0.01)
            assert p.paused
            p.paused = False
        finally:
            stop.set()
            for t in ts:
                t.join()
        assert hello["program"] == "python" and hello["pid"] == os.getpid()
        assert hello["stages"] == {"stages": p.stages}
        assert hello["ns_per_mark"] > 0
        assert hello["host"] == socket.gethostname()
        qs = samples[-1]["q"][0]
        assert qs["id"] == 0 and 0 <= qs["min"] <= qs["depth"] <= qs["max"] <= 4
        assert qs["push"] >= qs["pop"] >= 1 and qs["age_sum"] > 0
        steps = [f for f in v.frames if f["t"] == "step"]
        metric = [f["m"] for f in steps if "m" in f]
        assert metric and all(set(m) == {"loss", "step"} for m in metric)
        assert not any(b'"tau"' in raw or b'"lr"' in raw for raw in v.raw)
        check_fields(v.frames)
    finally:
        v.close()
        p.close()
    assert not os.path.exists(path)


def check_fields(frames):
    """Every frame's fields are fields of the Rust struct it decodes into, and every field the
    Rust side requires is there."""
    if not os.path.exists(PROTOCOL_RS):
        return
    rust = rust_message_fields()
    seen = set()

    def check(kind, obj):
        want = rust[kind]
        extra = set(obj) - set(want) - {"t"}
        assert not extra, "%s: fields the Rust side does not have: %s" % (kind, extra)
        missing = [f for f, (_, optional) in want.items() if not optional and f not in obj]
        assert not missing, "%s: required fields missing: %s" % (kind, missing)

    for f in frames:
        kind = f["t"]
        if kind in rust:
            seen.add(kind)
            check(kind, f)
            if kind == "step" and "m" in f:
                assert set(f["m"]) <= set(dflash_top.protocol.METRICS), f["m"]
            if kind == "sample":
                for live in f["live"]:
                    check("live", live)
                for q in f["q"]:
                    check("q", q)
                for a in f.get("alloc", []):
                    check("alloc", a)
    assert seen == {"hello", "thread", "queue", "step", "sample"}
