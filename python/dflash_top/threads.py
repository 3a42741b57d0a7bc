"""Per-thread recorders: the step a registered thread is in (time per phase so far, the phase
now, when it began), and `with prof.phase(name):` on top of the profiler's marks.

A mark is a clock read and three attribute writes on the thread's own record; nothing here is
shared between threads except for reading (the sampler reads a record's live step).

This module knows nothing of the profiler: a `Phase` works on any `Marker` (what it needs of
one), so it imports only the protocol's constants."""

import threading
from typing import Any, Dict, List, Protocol, Sequence, Tuple

from .protocol import OTHER

__all__ = ["ThreadRecord", "Phase", "Marker"]

# A (phase index, ns) pair as the protocol sends it.
PhaseTimes = List[List[int]]


class ThreadRecord:
    """One registered thread: what `Profiler.thread` returns.

    `acc[k]` is the time of phase `k` in the step so far (the last slot is `other`), `cur` the
    phase now, `last` when it began, `step_start` when the step began (monotonic ns)."""

    __slots__ = (
        "id", "stage", "idx", "acc", "cur", "last", "step_start", "stack", "epoch", "gpu",
        "events", "pending", "other",
    )

    def __init__(
        self, tid: int, stage: int, phases: Sequence[str], now: int, epoch: int, gpu: bool
    ) -> None:
        self.id = tid
        self.stage = stage
        self.idx: Dict[str, int] = {p: i for i, p in enumerate(phases)}
        self.other = len(phases)
        self.idx[OTHER] = self.other
        self.acc: List[int] = [0] * (len(phases) + 1)
        self.cur = self.other
        self.last = self.step_start = now
        self.stack: List[int] = []
        self.epoch = epoch
        self.gpu = gpu
        # CUDA events of the step in progress, and of ended steps not yet complete on the device.
        self.events: List[Tuple[int, Any]] = []
        self.pending: List[Tuple[int, List[Tuple[int, Any]]]] = []

    def phase_times(self) -> PhaseTimes:
        """The step's phases so far, `other` left out, as `[[k, ns], ...]`."""
        return [[k, v] for k, v in enumerate(self.acc[:-1]) if v]

    def new_step(self, now: int, epoch: int) -> None:
        """Starts the next step at `now` in `other`."""
        self.acc = [0] * len(self.acc)
        self.cur = self.other
        self.stack.clear()
        self.epoch = epoch
        self.last = self.step_start = now


class Marker(Protocol):
    """What a `Phase` uses of the profiler that made it: its switch, its per-thread records
    (`_tls.rec`, a `ThreadRecord`), whether marks are recorded, and `mark` (for the sentence
    an undeclared phase raises)."""

    on: bool
    _tls: threading.local

    def mark(self, phase: str) -> None: ...

    def _switch(self, r: ThreadRecord, k: int) -> None: ...


class Phase:
    """`with prof.phase(name):` — the phase `name` while inside, the previous one after. One
    object per name, shared by all threads (the state is on each thread's record)."""

    __slots__ = ("prof", "name")

    def __init__(self, prof: Marker, name: str) -> None:
        self.prof = prof
        self.name = name

    def __enter__(self) -> "Phase":
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

    def __exit__(self, *exc: Any) -> None:
        p = self.prof
        try:
            r = p._tls.rec
        except AttributeError:
            return
        prev = r.stack.pop() if r.stack else r.other
        if p.on:
            p._switch(r, prev)
