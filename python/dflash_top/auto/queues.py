"""Zero-code mode's queues: `queue.Queue` wrapped so that blocked puts and gets are phases and
every queue between two stages is counted and declared to the viewers (`Auto.install` installs
it, python/dflash_top/auto/session.py)."""

import queue as queue_module
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .. import protocol
from ..protocol import POP_WAIT, PUSH_WAIT
from ..queues import QueueCounters
from .common import _END_PUT, _mono


class _QStats(QueueCounters):
    """One queue.Queue's counters, updated inside the queue's own `_put` / `_get` (under its
    lock) and around blocked puts and gets, with what zero-code mode learns of it: the stages
    that put and take, and the tokens its items carry."""

    def __init__(self, q: "queue_module.Queue[Any]") -> None:
        super().__init__(q.maxsize)
        # (put time, tokens of the step that put it), oldest first (FIFO queues).
        self.items: Deque[Tuple[int, int]] = deque()
        self.producer: Optional[str] = None
        self.consumer: Optional[str] = None
        self.qid: Optional[int] = None

    def read(self, now: int) -> Dict[str, int]:
        return self.sample(self.qid or 0, now)


def stats_of(a: Any, q: "queue_module.Queue[Any]") -> Optional[_QStats]:
    """The counters of queue `q` (made at its first use), None for a queue left alone."""
    st = q.__dict__.get("_dft")
    if st is None:
        if q.__dict__.get("_dft_skip"):
            return None
        with a._lock:
            st = q.__dict__.get("_dft")
            if st is None:
                st = q.__dict__["_dft"] = _QStats(q)
    return st

def note_side(a: Any, st: _QStats, r: Any, producer: bool) -> None:
    """Records which stage puts and which takes; a queue between two stages is declared
    once both are known (and the chain reordered)."""
    if producer:
        if st.producer is not None:
            return
        st.producer = r.stage
    else:
        if st.consumer is not None:
            return
        st.consumer = r.stage
    if st.producer is None or st.consumer is None or st.producer == st.consumer:
        return
    with a._lock:
        st.qid = len(a._queues)
        a._queues.append(st)
        a._edges.append((st.producer, st.consumer))
        a._reorder()
        a._table_changed()
        if a._server:
            n = sum(1 for o in a._queues if o.producer == st.producer)
            name = "%s>%s" % (st.producer, st.consumer)
            if n > 1:
                name += "#%d" % n
            a._server.declare(
                {
                    "t": protocol.QUEUE,
                    "id": st.qid,
                    "name": name,
                    "capacity": st.maxsize if st.maxsize > 0 else 1 << 30,
                    "producer": st.producer,
                    "consumer": st.consumer,
                }
            )


def install(a: Any) -> None:
    """Wraps `queue.Queue`: blocked puts and gets are `push_wait` / `pop_wait`, and every
    queue between two stages is counted (depth, waits, item age) and declared."""
    Q = queue_module.Queue

    def wrap_put(orig: Any) -> Any:
        def put(self: Any, item: Any, block: bool = True, timeout: Optional[float] = None) -> Any:
            r = a._rec()
            st = stats_of(a, self) if r is not None else None
            if st is None or r is None:
                return orig(self, item, block, timeout)
            try:
                orig(self, item, False)
            except queue_module.Full:
                if not block:
                    raise
                wait(st, st.pushers, "push_wait", r, a._phase_idx[PUSH_WAIT],
                     lambda: orig(self, item, True, timeout))
            note_side(a, st, r, True)
            a.step_event(r, _END_PUT)

        return put

    def wrap_get(orig: Any) -> Any:
        def get(self: Any, block: bool = True, timeout: Optional[float] = None) -> Any:
            r = a._rec()
            st = stats_of(a, self) if r is not None else None
            if st is None or r is None:
                return orig(self, block, timeout)
            try:
                item = orig(self, False)
            except queue_module.Empty:
                if not block:
                    raise
                item = wait(st, st.poppers, "pop_wait", r, a._phase_idx[POP_WAIT],
                            lambda: orig(self, True, timeout))
            note_side(a, st, r, False)
            return item

        return get

    def wait(st: _QStats, waiting: List[int], total: str, r: Any, k: int,
             call: Callable[[], Any]) -> Any:
        start = st.begin_wait(waiting)
        a.enter(r, k)
        try:
            return call()
        finally:
            a.leave(r)
            st.end_wait(waiting, start, total)

    def wrap_inner_put(orig: Any) -> Any:
        def _put(self: Any, item: Any) -> None:
            orig(self, item)
            st = self.__dict__.get("_dft")
            if st is None:
                return
            r = getattr(a._tls, "rec", None)
            tok = (r.tok_fwd or r.tok_in) if r is not None else 0
            with st.lock:
                now = _mono()
                st.items.append((now, tok))
                st.advance(now, st.depth + 1)
                st.pushes += 1

        return _put

    def wrap_inner_get(orig: Any) -> Any:
        def _get(self: Any) -> Any:
            item = orig(self)
            st = self.__dict__.get("_dft")
            if st is None:
                return item
            with st.lock:
                now = _mono()
                stamp, tok = st.items.popleft() if st.items else (now, 0)
                st.advance(now, max(0, st.depth - 1))
                st.pops += 1
                st.age_sum += max(0, now - stamp)
            r = getattr(a._tls, "rec", None)
            if r is not None:
                r.tok_in += tok
            return item

        return _get

    a._patch(Q, "put", wrap_put)
    a._patch(Q, "get", wrap_get)
    a._patch(Q, "_put", wrap_inner_put)
    a._patch(Q, "_get", wrap_inner_get)
