"""The Profiler: declares a pipeline's stages, registers its threads, records their phases and
steps, wraps its queues, and serves all of it on this process's dflash-top socket.

Standard library only; torch is used, when present, for CUDA-event device times of threads
registered on a `cuda` device, and, once the pipeline initialised CUDA, for the caching
allocator's figures of those devices in the samples. Profiling off (`p` in the viewer) costs one
attribute read a mark. Serving, samples, commands and closing are the `Producer`'s
(dflash_top/producer.py), which zero-code mode shares.
"""

import math
import queue as queue_module
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .producer import Producer
from .protocol import POP_WAIT, PUSH_WAIT
from .queues import ProfiledQueue
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


class Profiler(Producer):
    """Declares a chain of stages (upstream first), records phases per thread and serves them on
    the dflash-top socket of this process.

    `stages`: names, or (name, [phase, ...]) pairs, upstream first. Each stage also gets the
    queue waits of its position: `pop_wait` (all but the first), `push_wait` (all but the last).
    `serve=False` records without a socket (nothing is sent); `path` overrides the socket's.
    """

    #: Called (on a server thread) when a viewer asks for a checkpoint; None: cannot save.
    on_checkpoint: Optional[Callable[[], None]]

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
        super().__init__()
        self._stages = decls
        self._stage_index = {d["name"]: i for i, d in enumerate(decls)}
        self.on_checkpoint = None
        self._tls = threading.local()
        self._threads: List[ThreadRecord] = []
        self._queues: List[ProfiledQueue] = []
        self._ctx: Dict[str, Phase] = {}
        self._lock = threading.Lock()
        self._steps = 0
        if serve:
            self._serve(path)

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: `[{"name": ..., "phases": [...]}, ...]`, waits included."""
        return [{"name": d["name"], "phases": list(d["phases"])} for d in self._stages]

    def _can_save(self) -> bool:
        return self.on_checkpoint is not None

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
        self._tls.rec = r
        self._declare_thread(r.id, threading.current_thread().name, self._stages[k]["name"], device)
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
        # The next step starts in `other`.
        msg, device_steps = self._step_record(r, now, r.phase_times(), on, r.other)
        if tokens:
            msg["tok"] = int(tokens)
        m = self._metrics(loss, tau, lr, grad_norm, step)
        if m is not None:
            msg["m"] = m
        self._send_step(r, msg, device_steps, r.other)
        epoch = self._epoch
        self._wait_while_paused()
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
        assert producer is not None and consumer is not None  # both named stages by now
        pq = ProfiledQueue(self, q, name)
        with self._lock:
            qid = len(self._queues)
            self._queues.append(pq)
        self._declare_queue(qid, name, q.maxsize, producer, consumer)
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

    def _checkpoint(self) -> None:
        if self.on_checkpoint is None:
            self.status("no checkpoint handler: set prof.on_checkpoint")
        else:
            self.on_checkpoint()

    def _live(self, with_sites: bool) -> List[Dict[str, Any]]:
        live = []
        for r in list(self._threads):
            acc = [[k, v] for k, v in enumerate(r.acc[:-1]) if v]
            live.append({"th": r.id, "ph": r.cur, "ps": r.last, "ss": r.step_start, "acc": acc})
        return live

    def _queue_samples(self, now: int) -> List[Dict[str, int]]:
        return [q._read(i, now) for i, q in enumerate(list(self._queues))]

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
