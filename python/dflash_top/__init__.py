"""dflash_top: watch a Python pipeline live with `dflash-top attach`.

    prof = Profiler(["producer", ("consumer", ["forward", "backward"])])
    q = prof.queue(queue.Queue(maxsize=8), "batches")   # between producer and consumer
    # in each worker thread:
    prof.thread("consumer")
    with prof.phase("forward"): ...
    prof.mark("backward"); ...
    prof.end_step(tokens=n, loss=loss)

Standard library only; torch is used, when present, for CUDA-event device times of threads
registered on a `cuda` device. Profiling off (`p` in the viewer) costs one attribute read a mark.
"""

import atexit
import os
import threading
import time

from . import wire
from .queues import ProfiledQueue
from .serve import Server

__all__ = ["Profiler", "ProfiledQueue"]

_mono = time.monotonic_ns

# GPU timing modes as the protocol names them, and the timing of a record in each.
_TIMING = {"Async": "GpuAsync", "Sync": "GpuSync", "Events": "GpuEvents"}


class _Thread:
    __slots__ = (
        "id", "stage", "idx", "acc", "cur", "last", "step_start", "stack", "epoch", "gpu",
        "events", "pending", "other",
    )


class _Phase:
    """`with prof.phase(name):` — one object per name, shared by all threads."""

    __slots__ = ("prof", "name")

    def __init__(self, prof, name):
        self.prof = prof
        self.name = name

    def __enter__(self):
        p = self.prof
        try:
            r = p._tls.rec
        except AttributeError:
            return self
        r.stack.append(r.cur)
        if p.on:
            k = r.idx.get(self.name)
            if k is None:
                p.mark(self.name)  # raises the sentence naming the phase and stage
            p._switch(r, k)
        return self

    def __exit__(self, *exc):
        p = self.prof
        try:
            r = p._tls.rec
        except AttributeError:
            return False
        prev = r.stack.pop() if r.stack else r.other
        if p.on:
            p._switch(r, prev)
        return False


class Profiler:
    """Declares a chain of stages (upstream first), records phases per thread and serves them on
    the dflash-top socket of this process.

    `stages`: names, or (name, [phase, ...]) pairs, upstream first. Each stage also gets the
    queue waits of its position: `pop_wait` (all but the first), `push_wait` (all but the last).
    """

    def __init__(self, stages, serve=True, path=None):
        decls = []
        for i, s in enumerate(stages):
            name, phases = (s, []) if isinstance(s, str) else (s[0], list(s[1]))
            if i > 0 and "pop_wait" not in phases:
                phases.insert(0, "pop_wait")
            if i < len(stages) - 1 and "push_wait" not in phases:
                phases.append("push_wait")
            decls.append({"name": name, "phases": phases})
        if not decls:
            raise ValueError("Profiler needs at least one stage")
        self._stages = decls
        self._stage_index = {d["name"]: i for i, d in enumerate(decls)}
        self.on = True
        self.gpu_timing = "Async"
        self.paused = False
        self.on_checkpoint = None
        self._epoch = 0
        self._tls = threading.local()
        self._threads = []
        self._queues = []
        self._ctx = {}
        self._lock = threading.Lock()
        self._steps = 0
        self._dropped = 0
        self._torch = None
        self._closed = threading.Event()
        self.ns_per_mark = 0.0
        self._server = None
        if serve:
            self.ns_per_mark = self._measure()
            self._server = Server(path or wire.socket_path(), self._hello, self._command)
            self._sampler = threading.Thread(
                target=self._sample_loop, name="dflash-top-sample", daemon=True
            )
            self._sampler.start()
            atexit.register(self.close)

    @property
    def path(self):
        return self._server.path if self._server else None

    def _hello(self):
        return {
            "t": "hello",
            "pid": os.getpid(),
            "program": "python",
            "now_ns": _mono(),
            "ns_per_mark": self.ns_per_mark,
            "stages": {"stages": self._stages},
            "can_save": self.on_checkpoint is not None,
        }

    # -- threads and phases ------------------------------------------------------------------

    def thread(self, stage, device="cpu"):
        """Registers the calling thread as a worker of `stage` (call it in the thread)."""
        k = self._stage_index.get(stage)
        if k is None:
            raise ValueError("unknown stage %r: declare it in Profiler([...])" % stage)
        phases = self._stages[k]["phases"]
        r = _Thread()
        r.stage = k
        r.idx = {p: i for i, p in enumerate(phases)}
        r.other = len(phases)
        r.idx["other"] = r.other
        r.acc = [0] * (len(phases) + 1)
        r.cur = r.other
        r.last = r.step_start = _mono()
        r.stack = []
        r.epoch = self._epoch
        r.gpu = device.startswith("cuda") and self._cuda()
        r.events = []
        r.pending = []
        with self._lock:
            r.id = len(self._threads)
            self._threads.append(r)
        self._tls.rec = r
        if self._server:
            self._server.declare(
                {
                    "t": "thread",
                    "id": r.id,
                    "name": threading.current_thread().name,
                    "stage": self._stages[k]["name"],
                    "device": device,
                    "tid": threading.get_native_id(),
                }
            )
        return r

    def _switch(self, r, k):
        now = _mono()
        if r.gpu:
            now = self._gpu_mark(r, k, now)
        r.acc[r.cur] += now - r.last
        r.last = now
        r.cur = k

    def mark(self, phase):
        """Ends the current phase and starts `phase` (a name of this thread's stage)."""
        if not self.on:
            return
        try:
            r = self._tls.rec
        except AttributeError:
            return
        try:
            k = r.idx[phase]
        except KeyError:
            raise ValueError(
                "phase %r is not declared for stage %r: add it to Profiler([...])"
                % (phase, self._stages[r.stage]["name"])
            ) from None
        now = _mono()
        if r.gpu:
            now = self._gpu_mark(r, k, now)
        r.acc[r.cur] += now - r.last
        r.last = now
        r.cur = k

    def phase(self, name):
        """A context manager: `name` while inside, the previous phase after."""
        c = self._ctx.get(name)
        if c is None:
            c = self._ctx[name] = _Phase(self, name)
        return c

    def end_step(self, tokens=0, loss=None):
        """Ends this thread's iteration: one record out (tokens count at the last stage)."""
        try:
            r = self._tls.rec
        except AttributeError:
            return
        now = _mono()
        on = self.on
        if on:
            r.acc[r.cur] += now - r.last
        timing = "Host"
        host_phases = True
        if r.gpu:
            timing = _TIMING[self.gpu_timing]
            if self.gpu_timing == "Events" and on:
                host_phases = False
                self._gpu_end(r, now)
        msg = {
            "t": "step",
            "th": r.id,
            "end": now,
            "wall": now - r.step_start,
            "ph": [[k, v] for k, v in enumerate(r.acc[:-1]) if v],
            "prof": on and r.epoch == self._epoch and host_phases,
            "timing": timing,
            "tok": int(tokens),
        }
        if loss is not None:
            with self._lock:
                self._steps += 1
                step = self._steps
            msg["m"] = {"loss": float(loss), "step": step}
        if self._server:
            self._server.broadcast(msg)
        r.acc = [0] * len(r.acc)
        r.cur = r.other
        r.stack.clear()
        r.epoch = self._epoch
        while self.paused and not self._closed.is_set():
            time.sleep(0.05)
        r.last = r.step_start = _mono()

    # -- queues ------------------------------------------------------------------------------

    def queue(self, q, name, producer=None, consumer=None):
        """Wraps a queue.Queue between two consecutive stages (by default the first two)."""
        names = [d["name"] for d in self._stages]
        if producer is None and consumer is None:
            if len(names) < 2:
                raise ValueError("a queue joins two stages; declare at least two")
            producer, consumer = names[0], names[1]
        elif producer is None:
            producer = names[self._stage_index[consumer] - 1]
        elif consumer is None:
            consumer = names[self._stage_index[producer] + 1]
        for s in (producer, consumer):
            if s not in self._stage_index:
                raise ValueError("unknown stage %r: declare it in Profiler([...])" % s)
        pq = ProfiledQueue(self, q, name)
        with self._lock:
            qid = len(self._queues)
            self._queues.append(pq)
        if self._server:
            self._server.declare(
                {
                    "t": "queue",
                    "id": qid,
                    "name": name,
                    "capacity": q.maxsize if q.maxsize > 0 else 1 << 30,
                    "producer": producer,
                    "consumer": consumer,
                }
            )
        return pq

    def _wait_begin(self, phase):
        """A queue wait starts: the thread shows `phase`; returns what to restore."""
        try:
            r = self._tls.rec
        except AttributeError:
            return None
        prev = r.cur
        if self.on:
            k = r.idx.get(phase)
            if k is not None:
                self._switch(r, k)
        return prev

    def _wait_end(self, prev):
        if prev is None or not self.on:
            return
        self._switch(self._tls.rec, prev)

    # -- control and sampling ------------------------------------------------------------------

    def _command(self, c):
        kind, value = c.get("cmd"), c.get("value")
        if kind == "set_profiling":
            self.on = bool(value)
            self._epoch += 1
        elif kind == "set_gpu_timing" and value in _TIMING:
            self.gpu_timing = value
        elif kind == "set_paused":
            self.paused = bool(value)
        elif kind == "checkpoint":
            if self.on_checkpoint is None:
                self.status("no checkpoint handler: set prof.on_checkpoint")
            else:
                self.on_checkpoint()

    def status(self, text):
        """A line for the viewers' header."""
        if self._server:
            self._server.control({"t": "status", "text": text})

    def _sample(self):
        now = _mono()
        live = []
        for r in list(self._threads):
            acc = [[k, v] for k, v in enumerate(r.acc[:-1]) if v]
            live.append({"th": r.id, "ph": r.cur, "ps": r.last, "ss": r.step_start, "acc": acc})
        return {
            "t": "sample",
            "now": now,
            "prof": self.on,
            "timing": self.gpu_timing,
            "paused": self.paused,
            "dropped": self._dropped,
            "live": live,
            "q": [q._read(i, now) for i, q in enumerate(list(self._queues))],
        }

    def _sample_loop(self):
        tick = 0.1
        nxt = time.monotonic() + tick
        while not self._closed.wait(max(0.0, nxt - time.monotonic())):
            nxt += tick
            if self._server.viewers():
                self._server.broadcast(self._sample())

    def close(self):
        """Stops serving and removes the socket (also done at interpreter exit)."""
        self._closed.set()
        if self._server:
            self._sampler.join(timeout=1)
            self._server.close()
            self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- costs and CUDA ------------------------------------------------------------------------

    def _measure(self, n=20000):
        """ns per mark on this interpreter, for the viewer's self-cost line."""
        p = Profiler([("m", ["a", "b"])], serve=False)
        done = []

        def run():
            p.thread("m")
            t0 = _mono()
            for _ in range(n // 2):
                p.mark("a")
                p.mark("b")
            done.append((_mono() - t0) / n)

        t = threading.Thread(target=run, name="dflash-top-measure")
        t.start()
        t.join()
        return done[0]

    def _cuda(self):
        if self._torch is None:
            try:
                import torch

                self._torch = torch if torch.cuda.is_available() else False
            except ImportError:
                self._torch = False
        return bool(self._torch)

    def _gpu_mark(self, r, k, now):
        mode = self.gpu_timing
        if mode == "Sync":
            self._torch.cuda.synchronize()
            return _mono()
        if mode == "Events":
            # Each event starts phase k on the device; the next one ends it.
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            r.events.append((k, ev))
        return now

    def _gpu_end(self, r, host_end):
        """Closes the step's events; sends device times of earlier steps whose events are done."""
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        r.events.append((r.other, ev))
        if len(r.events) > 1:
            r.pending.append((host_end, r.events))
        r.events = [(r.other, ev)]
        while r.pending and r.pending[0][1][-1][1].query():
            end, evs = r.pending.pop(0)
            acc = [0] * len(r.acc)
            for (k, a), (_, b) in zip(evs, evs[1:]):
                acc[k] += int(a.elapsed_time(b) * 1e6)
            if self._server:
                self._server.broadcast(
                    {
                        "t": "step",
                        "th": r.id,
                        "end": end,
                        "wall": sum(acc),
                        "ph": [[k, v] for k, v in enumerate(acc[:-1]) if v],
                        "prof": True,
                        "timing": "GpuEvents",
                        "steps": 0,
                    }
                )
