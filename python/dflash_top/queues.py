"""A queue.Queue that measures itself: pushes, pops, time producers wait on it full and
consumers on it empty (counted while they last), time-weighted depth, time empty and full, and
the age of an item when it is taken.

This module knows nothing of the profiler: a queue marks its waits through any `Waits` (what it
needs of one), so it imports nothing of the package."""

import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Protocol

__all__ = ["ProfiledQueue", "QueueCounters", "Waits"]

_mono = time.monotonic_ns


class Waits(Protocol):
    """What a `ProfiledQueue` uses of the profiler that made it: a blocked put or get shows
    `push_wait` or `pop_wait` on the calling thread, and its previous phase after."""

    def _wait_begin(self, phase: str) -> Optional[int]: ...

    def _wait_end(self, prev: Optional[int]) -> None: ...


class QueueCounters:
    """A queue's counters, as the protocol's queue sample carries them: pushes, pops, the time
    pushers and poppers waited (those waiting now included), time-weighted depth, time empty and
    full, the age of items taken, and the depth's range since the last sample. What a
    `ProfiledQueue` keeps, and what zero-code mode keeps for each `queue.Queue`.

    `depth_of`: how deep the queue is now (read under `lock`); None: `depth` as the owner keeps
    it (it calls `advance` with the new depth at each put and get)."""

    def __init__(self, maxsize: int, depth_of: Optional[Callable[[], int]] = None) -> None:
        self.maxsize = maxsize
        self._depth_of = depth_of
        self.lock = threading.Lock()
        self.at = _mono()
        self.depth = 0
        self.min = self.max = 0
        self.pushes = self.pops = 0
        self.push_wait = self.pop_wait = 0
        self.depth_ns = self.empty_ns = self.full_ns = 0
        self.age_sum = 0
        # Waits in progress: (count, sum of start times), for pushers and poppers.
        self.pushers: List[int] = [0, 0]
        self.poppers: List[int] = [0, 0]

    def _depth_now(self) -> int:
        return self._depth_of() if self._depth_of is not None else self.depth

    def advance(self, now: int, depth: int) -> None:
        """The time-weighted counters up to `now`; the queue is `depth` deep from then on."""
        if now < self.at:
            now = self.at
        dt = now - self.at
        self.depth_ns += self.depth * dt
        if self.depth == 0:
            self.empty_ns += dt
        if self.maxsize > 0 and self.depth >= self.maxsize:
            self.full_ns += dt
        self.at = now
        self.depth = depth
        if depth < self.min:
            self.min = depth
        if depth > self.max:
            self.max = depth

    def begin_wait(self, waiting: List[int]) -> int:
        """A put or get blocks (`waiting`: `pushers` or `poppers`); returns when it began."""
        with self.lock:
            self.advance(_mono(), self._depth_now())
            waiting[0] += 1
            waiting[1] += self.at
            return self.at

    def end_wait(self, waiting: List[int], start: int, total: str) -> None:
        """Ends a wait begun at `start`, adding its length to the counter named `total`
        (`push_wait` or `pop_wait`)."""
        with self.lock:
            now = max(_mono(), self.at)
            waiting[0] -= 1
            waiting[1] -= start
            setattr(self, total, getattr(self, total) + now - start)

    def sample(self, qid: int, now: int) -> Dict[str, int]:
        """Cumulative counters up to `now` (waits in progress included), as the protocol's
        queue sample of queue `qid`; resets the depth range."""
        with self.lock:
            self.advance(now, self._depth_now())
            at = self.at
            out = {
                "id": qid,
                "at": at,
                "depth": self.depth,
                "push": self.pushes,
                "pop": self.pops,
                "push_wait": self.push_wait + self.pushers[0] * at - self.pushers[1],
                "pop_wait": self.pop_wait + self.poppers[0] * at - self.poppers[1],
                "depth_ns": self.depth_ns,
                "empty": self.empty_ns,
                "full": self.full_ns,
                "age_sum": self.age_sum,
                "min": self.min,
                "max": self.max,
            }
            self.min = self.max = self.depth
            return out


class ProfiledQueue:
    """What `Profiler.queue` returns: the queue's interface (put, get, their `_nowait` forms,
    qsize, empty, full, task_done, join), measured. A thread of the profiler that blocks in
    `put` shows `push_wait`, in `get` `pop_wait`."""

    def __init__(self, prof: Waits, q: "queue.Queue[Any]", name: str) -> None:
        self._prof = prof
        self._q = q
        self.name = name
        self.maxsize = q.maxsize
        # Items go in as (item, put time); the depth is the queue's own.
        self._counts = QueueCounters(q.maxsize, q.qsize)

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        c = self._counts
        try:
            self._q.put_nowait((item, _mono()))
        except queue.Full:
            if not block:
                raise
            start = c.begin_wait(c.pushers)
            prev = self._prof._wait_begin("push_wait")
            try:
                self._q.put((item, _mono()), timeout=timeout)
            finally:
                self._prof._wait_end(prev)
                c.end_wait(c.pushers, start, "push_wait")
        with c.lock:
            c.advance(_mono(), self._q.qsize())
            c.pushes += 1

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        c = self._counts
        try:
            item, stamp = self._q.get_nowait()
        except queue.Empty:
            if not block:
                raise
            start = c.begin_wait(c.poppers)
            prev = self._prof._wait_begin("pop_wait")
            try:
                item, stamp = self._q.get(timeout=timeout)
            finally:
                self._prof._wait_end(prev)
                c.end_wait(c.poppers, start, "pop_wait")
        with c.lock:
            now = _mono()
            c.advance(now, self._q.qsize())
            c.pops += 1
            c.age_sum += max(0, now - stamp)
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
        """The queue's sample as queue `qid` (QueueCounters.sample)."""
        return self._counts.sample(qid, now)
