"""A queue.Queue that measures itself: pushes, pops, time producers wait on it full and
consumers on it empty (counted while they last), time-weighted depth, time empty and full, and
the age of an item when it is taken.

This module knows nothing of the profiler: a queue marks its waits through any `Waits` (what it
needs of one), so it imports nothing of the package."""

import queue
import threading
import time
from typing import Any, Dict, List, Optional, Protocol

__all__ = ["ProfiledQueue", "Waits"]

_mono = time.monotonic_ns


class Waits(Protocol):
    """What a `ProfiledQueue` uses of the profiler that made it: a blocked put or get shows
    `push_wait` or `pop_wait` on the calling thread, and its previous phase after."""

    def _wait_begin(self, phase: str) -> Optional[int]: ...

    def _wait_end(self, prev: Optional[int]) -> None: ...


class ProfiledQueue:
    """What `Profiler.queue` returns: the queue's interface (put, get, their `_nowait` forms,
    qsize, empty, full, task_done, join), measured. A thread of the profiler that blocks in
    `put` shows `push_wait`, in `get` `pop_wait`."""

    def __init__(self, prof: Waits, q: "queue.Queue[Any]", name: str) -> None:
        self._prof = prof
        self._q = q
        self.name = name
        self.maxsize = q.maxsize
        self._lock = threading.Lock()
        self._at = _mono()
        self._depth = 0
        self._min = self._max = 0
        self._pushes = self._pops = 0
        self._push_wait = self._pop_wait = 0
        self._depth_ns = self._empty_ns = self._full_ns = 0
        self._age_sum = 0
        # Waits in progress: (count, sum of start times), for pushers and poppers.
        self._pushers: List[int] = [0, 0]
        self._poppers: List[int] = [0, 0]

    def _advance(self, now: int, depth: int) -> None:
        if now < self._at:
            now = self._at
        dt = now - self._at
        self._depth_ns += self._depth * dt
        if self._depth == 0:
            self._empty_ns += dt
        if self.maxsize > 0 and self._depth >= self.maxsize:
            self._full_ns += dt
        self._at = now
        self._depth = depth
        if depth < self._min:
            self._min = depth
        if depth > self._max:
            self._max = depth

    def _begin(self, waiting: List[int]) -> int:
        with self._lock:
            now = _mono()
            self._advance(now, self._q.qsize())
            waiting[0] += 1
            waiting[1] += self._at
            return self._at

    def _end(self, waiting: List[int], start: int, total: str) -> None:
        """Ends a wait begun at `start`, adding its length to the counter named `total`."""
        with self._lock:
            now = max(_mono(), self._at)
            waiting[0] -= 1
            waiting[1] -= start
            setattr(self, total, getattr(self, total) + now - start)

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        try:
            self._q.put_nowait((item, _mono()))
        except queue.Full:
            if not block:
                raise
            start = self._begin(self._pushers)
            prev = self._prof._wait_begin("push_wait")
            try:
                self._q.put((item, _mono()), timeout=timeout)
            finally:
                self._prof._wait_end(prev)
                self._end(self._pushers, start, "_push_wait")
        with self._lock:
            self._advance(_mono(), self._q.qsize())
            self._pushes += 1

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        try:
            item, stamp = self._q.get_nowait()
        except queue.Empty:
            if not block:
                raise
            start = self._begin(self._poppers)
            prev = self._prof._wait_begin("pop_wait")
            try:
                item, stamp = self._q.get(timeout=timeout)
            finally:
                self._prof._wait_end(prev)
                self._end(self._poppers, start, "_pop_wait")
        with self._lock:
            now = _mono()
            self._advance(now, self._q.qsize())
            self._pops += 1
            self._age_sum += max(0, now - stamp)
        return item

    def put_nowait(self, item: Any) -> None:
        self.put(item, block=False)

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        return self._q.qsize()

    def empty(self) -> bool:
        return self._q.empty()

    def full(self) -> bool:
        return self._q.full()

    def task_done(self) -> None:
        self._q.task_done()

    def join(self) -> None:
        self._q.join()

    def _read(self, qid: int, now: int) -> Dict[str, int]:
        """Cumulative counters up to `now` (waits in progress included), as the protocol's
        queue sample; resets the depth range."""
        with self._lock:
            self._advance(now, self._q.qsize())
            at = self._at
            out = {
                "id": qid,
                "at": at,
                "depth": self._depth,
                "push": self._pushes,
                "pop": self._pops,
                "push_wait": self._push_wait + self._pushers[0] * at - self._pushers[1],
                "pop_wait": self._pop_wait + self._poppers[0] * at - self._poppers[1],
                "depth_ns": self._depth_ns,
                "empty": self._empty_ns,
                "full": self._full_ns,
                "age_sum": self._age_sum,
                "min": self._min,
                "max": self._max,
            }
            self._min = self._max = self._depth
            return out
