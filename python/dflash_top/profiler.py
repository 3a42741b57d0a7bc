"""The Profiler: declares a pipeline's stages, registers its threads, records their phases and
steps, wraps its queues, and serves all of it on this process's dflash-top socket.

Standard library only; torch is used, when present, for CUDA-event device times of threads
registered on a `cuda` device, and, once the pipeline initialised CUDA, for the caching
allocator's figures of those devices in the samples. Profiling off (`p` in the viewer) costs one
attribute read a mark.
"""

import atexit
import math
import os
import queue as queue_module
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from . import protocol, wire
from .cuda import CudaTiming, cuda_index, read_alloc
from .protocol import POP_WAIT, PUSH_WAIT, TIMING_HOST, TIMING_OF
from .queues import ProfiledQueue
from .serve import Server
from .threads import Phase, ThreadRecord

__all__ = ["Profiler", "StageSpec"]

_mono = time.monotonic_ns

#: A stage as declared: its name, or its name and the phases its threads mark.
StageSpec = Union[str, Tuple[str, Sequence[str]]]


def _finite(value: Any) -> Optional[float]:
    """`value` as a float, or None when it is not finite (JSON has no NaN; the viewer shows
    the value as absent)."""
    v = float(value)
    return v if math.isfinite(v) else None


class Profiler:
    """Declares a chain of stages (upstream first), records phases per thread and serves them on
    the dflash-top socket of this process.

    `stages`: names, or (name, [phase, ...]) pairs, upstream first. Each stage also gets the
    queue waits of its position: `pop_wait` (all but the first), `push_wait` (all but the last).
    `serve=False` records without a socket (nothing is sent); `path` overrides the socket's.
    """

    #: Called (on a server thread) when a viewer asks for a checkpoint; None: cannot save.
    on_checkpoint: Optional[Callable[[], None]]
    #: Whether marks are recorded (the viewer's `p` switches it).
    on: bool
    #: The GPU timing mode of threads on a `cuda` device: `Async`, `Sync` or `Events`.
    gpu_timing: str
    #: Whether threads wait at their next `end_step` (the viewer's pause).
    paused: bool
    #: What one mark costs on this interpreter, ns (measured when serving).
    ns_per_mark: float

    def __init__(
        self, stages: Sequence[StageSpec], serve: bool = True, path: Optional[str] = None
    ) -> None:
        decls: List[Dict[str, Any]] = []
        for i, s in enumerate(stages):
            name, phases = (s, []) if isinstance(s, str) else (s[0], list(s[1]))
            if i > 0 and POP_WAIT not in phases:
                phases.insert(0, POP_WAIT)
            if i < len(stages) - 1 and PUSH_WAIT not in phases:
                phases.append(PUSH_WAIT)
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
        self._threads: List[ThreadRecord] = []
        self._queues: List[ProfiledQueue] = []
        self._ctx: Dict[str, Phase] = {}
        self._lock = threading.Lock()
        self._steps = 0
        self._dropped = 0
        self._cuda = CudaTiming()
        # The CUDA devices threads declared (their allocator's figures go in the samples).
        self._cuda_devices: Set[int] = set()
        self._closed = threading.Event()
        self.ns_per_mark = 0.0
        self._server: Optional[Server] = None
        if serve:
            self.ns_per_mark = self._measure()
            self._server = Server(path or wire.socket_path(), self._hello, self._command)
            self._sampler = threading.Thread(
                target=self._sample_loop, name="dflash-top-sample", daemon=True
            )
            self._sampler.start()
            atexit.register(self.close)

    @property
    def path(self) -> Optional[str]:
        """The socket viewers attach to (None when not serving)."""
        return self._server.path if self._server else None

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: `[{"name": ..., "phases": [...]}, ...]`, waits included."""
        return [{"name": d["name"], "phases": list(d["phases"])} for d in self._stages]

    def _hello(self) -> Dict[str, Any]:
        return {
            "t": protocol.HELLO,
            "pid": os.getpid(),
            "program": "python",
            "now_ns": _mono(),
            "ns_per_mark": self.ns_per_mark,
            "stages": {"stages": self._stages},
            "can_save": self.on_checkpoint is not None,
            # Its host: a viewer on another host (a socket forwarded with ssh -L) knows the
            # pipeline is not on its own.
            "host": socket.gethostname(),
        }

    # -- threads and phases ------------------------------------------------------------------

    def thread(self, stage: str, device: str = "cpu") -> ThreadRecord:
        """Registers the calling thread as a worker of `stage` (call it in the thread)."""
        k = self._stage_index.get(stage)
        if k is None:
            raise ValueError("unknown stage %r: declare it in Profiler([...])" % stage)
        gpu = device.startswith("cuda") and self._cuda.available()
        with self._lock:
            r = ThreadRecord(
                len(self._threads), k, self._stages[k]["phases"], _mono(), self._epoch, gpu
            )
            self._threads.append(r)
            n = cuda_index(device)
            if n is not None:
                self._cuda_devices.add(n)
        self._tls.rec = r
        if self._server:
            self._server.declare(
                {
                    "t": protocol.THREAD,
                    "id": r.id,
                    "name": threading.current_thread().name,
                    "stage": self._stages[k]["name"],
                    "device": device,
                    "tid": threading.get_native_id(),
                }
            )
        return r

    def _switch(self, r: ThreadRecord, k: int) -> None:
        now = _mono()
        if r.gpu:
            now = self._cuda.mark(r, k, now, self.gpu_timing)
        r.acc[r.cur] += now - r.last
        r.last = now
        r.cur = k

    def mark(self, phase: str) -> None:
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
        # `_switch` written out: the hot path; calling it costs ~45 ns a mark (225 -> 270 ns,
        # python/examples/mark_cost.py).
        now = _mono()
        if r.gpu:
            now = self._cuda.mark(r, k, now, self.gpu_timing)
        r.acc[r.cur] += now - r.last
        r.last = now
        r.cur = k

    def phase(self, name: str) -> Phase:
        """A context manager: `name` while inside, the previous phase after."""
        c = self._ctx.get(name)
        if c is None:
            c = self._ctx[name] = Phase(self, name)
        return c

    def end_step(
        self,
        tokens: int = 0,
        loss: Optional[float] = None,
        *,
        tau: Optional[float] = None,
        lr: Optional[float] = None,
        grad_norm: Optional[float] = None,
        step: Optional[int] = None,
    ) -> None:
        """Ends this thread's iteration: one record out (tokens count at the last stage).

        Training numbers are optional, and only those given are sent: one never given (or not
        finite) is shown as absent, not as zero. `step` is the optimizer step; left out, it is
        this process's count of steps that reported a number."""
        try:
            r = self._tls.rec
        except AttributeError:
            return
        now = _mono()
        on = self.on
        if on:
            r.acc[r.cur] += now - r.last
        timing = TIMING_HOST
        host_phases = True
        device_steps: List[Tuple[int, Dict[int, int]]] = []
        if r.gpu:
            timing = TIMING_OF[self.gpu_timing]
            if self.gpu_timing == "Events" and on:
                host_phases = False
                device_steps = self._cuda.end_step(r, now, r.other)
        msg: Dict[str, Any] = {
            "t": protocol.STEP,
            "th": r.id,
            "end": now,
            "wall": now - r.step_start,
            "ph": r.phase_times(),
            "prof": on and r.epoch == self._epoch and host_phases,
            "timing": timing,
        }
        if tokens:
            msg["tok"] = int(tokens)
        m = self._metrics(loss, tau, lr, grad_norm, step)
        if m is not None:
            msg["m"] = m
        if self._server:
            # Device times of earlier steps first (as they completed), then this step.
            for end, acc in device_steps:
                self._server.broadcast(
                    {
                        "t": protocol.STEP,
                        "th": r.id,
                        "end": end,
                        "wall": sum(acc.values()),
                        "ph": [[k, v] for k, v in sorted(acc.items()) if v and k != r.other],
                        "prof": True,
                        "timing": TIMING_OF["Events"],
                        "steps": 0,
                    }
                )
            self._server.broadcast(msg)
        epoch = self._epoch
        while self.paused and not self._closed.is_set():
            time.sleep(0.05)
        r.new_step(_mono(), epoch)

    def _metrics(
        self,
        loss: Optional[float],
        tau: Optional[float],
        lr: Optional[float],
        grad_norm: Optional[float],
        step: Optional[int],
    ) -> Optional[Dict[str, Any]]:
        """A step's `m`: the numbers given, and no others."""
        given = (("loss", loss), ("tau", tau), ("lr", lr), ("grad_norm", grad_norm))
        if step is None and all(v is None for _, v in given):
            return None
        m: Dict[str, Any] = {}
        for name, value in given:
            if value is not None:
                v = _finite(value)
                if v is not None:
                    m[name] = v
        if step is not None:
            m["step"] = int(step)
        else:
            with self._lock:
                self._steps += 1
                m["step"] = self._steps
        return m

    # -- queues ------------------------------------------------------------------------------

    def queue(
        self,
        q: "queue_module.Queue[Any]",
        name: str,
        producer: Optional[str] = None,
        consumer: Optional[str] = None,
    ) -> ProfiledQueue:
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
                    "t": protocol.QUEUE,
                    "id": qid,
                    "name": name,
                    "capacity": q.maxsize if q.maxsize > 0 else 1 << 30,
                    "producer": producer,
                    "consumer": consumer,
                }
            )
        return pq

    def _wait_begin(self, phase: str) -> Optional[int]:
        """A queue wait starts: the thread shows `phase`; returns what to restore."""
        try:
            r: ThreadRecord = self._tls.rec
        except AttributeError:
            return None
        prev = r.cur
        if self.on:
            k = r.idx.get(phase)
            if k is not None:
                self._switch(r, k)
        return prev

    def _wait_end(self, prev: Optional[int]) -> None:
        if prev is None or not self.on:
            return
        self._switch(self._tls.rec, prev)

    # -- control and sampling ------------------------------------------------------------------

    def _command(self, c: Dict[str, Any]) -> None:
        kind, value = c.get("cmd"), c.get("value")
        if kind == protocol.SET_PROFILING:
            self.on = bool(value)
            self._epoch += 1
        elif kind == protocol.SET_GPU_TIMING and value in TIMING_OF:
            self.gpu_timing = value
        elif kind == protocol.SET_PAUSED:
            self.paused = bool(value)
        elif kind == protocol.CHECKPOINT:
            if self.on_checkpoint is None:
                self.status("no checkpoint handler: set prof.on_checkpoint")
            else:
                self.on_checkpoint()

    def status(self, text: str) -> None:
        """A line for the viewers' header."""
        if self._server:
            self._server.control({"t": protocol.STATUS, "text": text})

    def _sample(self) -> Dict[str, Any]:
        now = _mono()
        live = []
        for r in list(self._threads):
            acc = [[k, v] for k, v in enumerate(r.acc[:-1]) if v]
            live.append({"th": r.id, "ph": r.cur, "ps": r.last, "ss": r.step_start, "acc": acc})
        msg: Dict[str, Any] = {
            "t": protocol.SAMPLE,
            "now": now,
            "prof": self.on,
            "timing": self.gpu_timing,
            "paused": self.paused,
            "dropped": self._dropped,
            "live": live,
            "q": [q._read(i, now) for i, q in enumerate(list(self._queues))],
        }
        alloc = read_alloc(tuple(self._cuda_devices))
        if alloc:
            msg["alloc"] = alloc
        return msg

    def _sample_loop(self) -> None:
        tick = 0.1
        nxt = time.monotonic() + tick
        while not self._closed.wait(max(0.0, nxt - time.monotonic())):
            nxt += tick
            server = self._server
            if server is not None and server.viewers():
                server.broadcast(self._sample())

    def close(self) -> None:
        """Stops serving and removes the socket (also done at interpreter exit)."""
        self._closed.set()
        if self._server:
            self._sampler.join(timeout=1)
            self._server.close()
            self._server = None

    def __enter__(self) -> "Profiler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- costs ---------------------------------------------------------------------------------

    def _measure(self, n: int = 20000) -> float:
        """ns per mark on this interpreter, for the viewer's self-cost line."""
        p = Profiler([("m", ["a", "b"])], serve=False)
        done: List[float] = []

        def run() -> None:
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
