"""Zero-code mode: live telemetry of an unmodified PyTorch script.

    python -m dflash_top run script.py [args]      # or, in the script: dflash_top.auto()

Every Python thread that does work becomes a row, named by its thread name; threads group into
stages by name (`target-0`, `target-1` -> `target`; the main thread is `main`), and stages are
ordered by the queues between them. Phases come from PyTorch's global hooks and a few wraps:

- the forward of each top-level module, named by its class (module forward hooks);
- `backward` (`Tensor.backward`, `torch.autograd.backward`), `clip`
  (`torch.nn.utils.clip_grad_norm_`), `optim` (optimizer step hooks): a thread's step ends at
  its optimizer's step (a thread without one: at its queue put, else at its forward's end);
- `data_wait` (a DataLoader's `__next__`), `pop_wait` / `push_wait` (`queue.Queue` get / put
  blocked), with the queue's depth, waits and item age;
- `sync`: host syncs (`.item()`, `.tolist()`, `.cpu()`, `.nonzero()`, `torch.cuda.synchronize`)
  wherever they happen, timed and counted (the step's `n`).

Tokens per step come from a top-level forward's `input_ids` (or first integer tensor argument)
and travel with queue items to the stage that takes them; a thread that sees none reports steps
only. The table grows as stages and phases appear: each change is a new `hello` to the viewers.
"""

import atexit
import os
import queue as queue_module
import re
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from . import protocol, wire
from .protocol import POP_WAIT, PUSH_WAIT, TIMING_HOST, TIMING_OF
from .serve import Server

__all__ = ["Auto", "auto", "stage_of"]

_mono = time.monotonic_ns

DATA_WAIT = "data_wait"
BACKWARD = "backward"
CLIP = "clip"
OPTIM = "optim"
SYNC = "sync"
#: Every stage's phases before module classes are seen (all stages share one list, which only
#: grows: a phase keeps its index and its slot in the viewer).
BASE_PHASES = [DATA_WAIT, POP_WAIT, BACKWARD, CLIP, OPTIM, SYNC, PUSH_WAIT]
#: The viewer's built-in phase names (src/telemetry/phase.rs); any other name takes one of its
#: N_CUSTOM slots for declared names.
BUILTIN_PHASES = (
    "other", "read", "pack", "push_wait", "batch_wait", "h2d", "forward", "hs_pack",
    "hs_push_wait", "hs_wait", "anchors", "loss", "backward", "clip", "optim", "metrics",
    "grad_sync",
)
N_CUSTOM = 12
MAX_STAGES = 16
MAX_NAME = 32
#: Steps ended (all threads) with no new top-level module before the global module hooks give
#: way to hooks on the top-level modules seen (a module first called at top level later runs
#: in its caller's phase, `other` at top level).
SETTLE_STEPS = 50
#: Phases whose entries a step counts (sent as the step's `n`).
COUNTED = (SYNC,)

# Step ends, strongest first: a thread ends its steps at the strongest kind it has seen.
_END_OPTIM, _END_PUT, _END_FORWARD, _END_NONE = 0, 1, 2, 3


def stage_of(thread_name: str) -> str:
    """The stage of a thread by its name: `target-0` -> `target`, `MainThread` -> `main`,
    `Thread-3 (worker)` -> `worker`."""
    if thread_name == "MainThread":
        return "main"
    m = re.fullmatch(r"Thread-\d+ \((.+)\)", thread_name)
    if m:
        return m.group(1)[:MAX_NAME]
    base = re.sub(r"[-_.:# ]?\d+$", "", thread_name)
    if re.fullmatch(r"Thread", base) or not base:
        return "thread"
    return base[:MAX_NAME]


class _Rec:
    """A thread's step in progress: `acc[k]` ns in phase k (the shared list's index), `cur` the
    phase now (-1: other), `last` when it began."""

    __slots__ = (
        "id", "name", "stage", "acc", "n", "cur", "last", "step_start", "stack", "depth",
        "tok_fwd", "tok_in", "end_kind", "opt_steps", "epoch", "gpu", "events", "pending",
    )

    def __init__(self, tid: int, name: str, stage: str, now: int, epoch: int, gpu: bool) -> None:
        self.id = tid
        self.name = name
        self.stage = stage
        self.acc: List[int] = []
        self.n: List[int] = []
        self.cur = -1
        self.last = self.step_start = now
        self.stack: List[int] = []
        self.depth = 0
        self.tok_fwd = 0
        self.tok_in = 0
        self.end_kind = _END_NONE
        self.opt_steps = 0
        self.epoch = epoch
        self.gpu = gpu
        self.events: List[Tuple[int, Any]] = []
        self.pending: List[Tuple[int, List[Tuple[int, Any]]]] = []


class _QStats:
    """One queue.Queue's counters (what `ProfiledQueue` keeps), updated inside the queue's own
    `_put` / `_get` (under its lock) and around blocked puts and gets."""

    def __init__(self, q: "queue_module.Queue[Any]") -> None:
        self.maxsize = q.maxsize
        self.lock = threading.Lock()
        self.at = _mono()
        self.depth = 0
        self.min = self.max = 0
        self.pushes = self.pops = 0
        self.push_wait = self.pop_wait = 0
        self.depth_ns = self.empty_ns = self.full_ns = 0
        self.age_sum = 0
        self.pushers = [0, 0]
        self.poppers = [0, 0]
        # (put time, tokens of the step that put it), oldest first (FIFO queues).
        self.items: Deque[Tuple[int, int]] = deque()
        self.producer: Optional[str] = None
        self.consumer: Optional[str] = None
        self.qid: Optional[int] = None

    def advance(self, now: int, depth: int) -> None:
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
        self.min = min(self.min, depth)
        self.max = max(self.max, depth)

    def read(self, now: int) -> Dict[str, int]:
        with self.lock:
            self.advance(now, self.depth)
            waits = []
            for w in (self.pushers, self.poppers):
                waits.append(w[0] * self.at - w[1] if w[0] else 0)
            out = {
                "id": self.qid or 0,
                "at": self.at,
                "depth": self.depth,
                "push": self.pushes,
                "pop": self.pops,
                "push_wait": self.push_wait + waits[0],
                "pop_wait": self.pop_wait + waits[1],
                "depth_ns": self.depth_ns,
                "empty": self.empty_ns,
                "full": self.full_ns,
                "age_sum": self.age_sum,
                "min": self.min,
                "max": self.max,
            }
            self.min = self.max = self.depth
            return out


class Auto:
    """The process-wide instrumentation: hooks installed by `install`, a socket served like a
    `Profiler`'s. One per process (`auto()` makes it)."""

    def __init__(self, serve: bool = True, path: Optional[str] = None) -> None:
        self.on = True
        self.gpu_timing = "Async"
        self.paused = False
        self.ns_per_mark = 0.0
        self._tls = threading.local()
        self._lock = threading.RLock()
        self._phases: List[str] = list(BASE_PHASES)
        self._phase_idx: Dict[str, int] = {p: i for i, p in enumerate(self._phases)}
        self._module_phase: Dict[type, int] = {}
        # Top-level modules seen, and steps ended since the last new one: after SETTLE_STEPS,
        # the global module hooks give way to hooks on these modules (see _install_torch).
        self._tops: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._settled = 0
        self._settle: Optional[Callable[[], None]] = None
        self._stages: List[str] = []
        self._edges: List[Tuple[str, str]] = []
        self._order: List[str] = []
        self._threads: List[_Rec] = []
        self._queues: List[_QStats] = []
        self._epoch = 0
        self._closed = threading.Event()
        self._torch: Any = None
        self._undo: List[Callable[[], None]] = []
        self._server: Optional[Server] = None
        if serve:
            self.ns_per_mark = self._measure()
            self._server = Server(path or wire.socket_path(), self._hello, self._command)
            self._sampler = threading.Thread(
                target=self._sample_loop, name="dflash-top-sample", daemon=True
            )
            self._sampler.start()
            atexit.register(self.close)

    # -- the table -------------------------------------------------------------------------------

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: stages in chain order, each with the shared phase list."""
        with self._lock:
            return [{"name": s, "phases": list(self._phases)} for s in self._order]

    def _hello(self) -> Dict[str, Any]:
        return {
            "t": protocol.HELLO,
            "pid": os.getpid(),
            "program": "python",
            "now_ns": _mono(),
            "ns_per_mark": self.ns_per_mark,
            "stages": {"stages": self.stages},
            "can_save": False,
        }

    def _reorder(self) -> None:
        """Stages in chain order: upstream of a queue before downstream (ties: first seen)."""
        order: List[str] = []
        left = list(self._stages)
        while left:
            ready = [s for s in left if not any(c == s and p in left for p, c in self._edges)]
            pick = ready[0] if ready else left[0]
            order.append(pick)
            left.remove(pick)
        self._order = order

    def _table_changed(self) -> None:
        """Tells the attached viewers (the next ones get it in their hello)."""
        if self._server:
            self._server.control(self._hello())

    def _phase(self, name: str) -> int:
        """The index of phase `name`, added to the shared list when new (names beyond the
        viewer's slots fall back to `forward`)."""
        k = self._phase_idx.get(name)
        if k is not None:
            return k
        with self._lock:
            k = self._phase_idx.get(name)
            if k is not None:
                return k
            custom = sum(1 for p in self._phases if p not in BUILTIN_PHASES)
            if name not in BUILTIN_PHASES and custom >= N_CUSTOM:
                return self._phase("forward")
            self._phases.append(name)
            k = self._phase_idx[name] = len(self._phases) - 1
            self._table_changed()
            return k

    # -- threads -----------------------------------------------------------------------------------

    def _rec(self) -> Optional[_Rec]:
        """The calling thread's record, registered on its first event (None for ours)."""
        try:
            return self._tls.rec  # type: ignore[no-any-return]
        except AttributeError:
            pass
        t = threading.current_thread()
        if t.name.startswith("dflash-top") or self._closed.is_set():
            self._tls.rec = None
            return None
        stage = stage_of(t.name)
        device = self._device()
        with self._lock:
            if stage not in self._stages:
                if len(self._stages) >= MAX_STAGES:
                    stage = self._stages[-1]
                else:
                    self._stages.append(stage)
                    self._reorder()
                    self._table_changed()
            gpu = device.startswith("cuda") and self._torch is not None
            r = _Rec(len(self._threads), t.name, stage, _mono(), self._epoch, gpu)
            self._threads.append(r)
            if self._server:
                self._server.declare(
                    {
                        "t": protocol.THREAD,
                        "id": r.id,
                        "name": t.name,
                        "stage": stage,
                        "device": device,
                        "tid": threading.get_native_id(),
                    }
                )
        self._tls.rec = r
        return r

    def _device(self) -> str:
        torch = self._torch
        try:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                return "cuda:%d" % torch.cuda.current_device()
        except Exception:  # noqa: BLE001 - a device query never breaks the script
            pass
        return "cpu"

    def _switch(self, r: _Rec, k: int) -> None:
        now = _mono()
        if r.gpu:
            now = self._gpu_mark(r, k, now)
        if r.cur >= 0:
            acc = r.acc
            while len(acc) <= r.cur:
                acc.append(0)
            acc[r.cur] += now - r.last
        r.last = now
        r.cur = k

    def enter(self, r: _Rec, k: int) -> None:
        """Phase k starts (nested: `leave` restores the phase it interrupted)."""
        r.stack.append(r.cur)
        if k in _COUNTED_IDX:
            n = r.n
            while len(n) <= k:
                n.append(0)
            n[k] += 1
        if self.on:
            self._switch(r, k)

    def leave(self, r: _Rec) -> None:
        prev = r.stack.pop() if r.stack else -1
        if self.on:
            self._switch(r, prev)

    def step_event(self, r: _Rec, kind: int) -> None:
        """A step boundary of `kind` (optimizer step, queue put, forward end) in thread r."""
        if kind < r.end_kind:
            r.end_kind = kind
        if kind == r.end_kind:
            self.end_step(r)

    def end_step(self, r: _Rec) -> None:
        self._settled += 1
        if self._settle is not None and self._settled >= SETTLE_STEPS:
            settle, self._settle = self._settle, None
            settle()
        now = _mono()
        on = self.on
        if on and r.cur >= 0:
            while len(r.acc) <= r.cur:
                r.acc.append(0)
            r.acc[r.cur] += now - r.last
        timing = TIMING_HOST
        host_phases = True
        device_steps: List[Tuple[int, Dict[int, int]]] = []
        if r.gpu:
            timing = TIMING_OF[self.gpu_timing]
            if self.gpu_timing == "Events" and on:
                host_phases = False
                device_steps = self._gpu_end_step(r, now)
        msg: Dict[str, Any] = {
            "t": protocol.STEP,
            "th": r.id,
            "end": now,
            "wall": now - r.step_start,
            "ph": [[k, v] for k, v in enumerate(r.acc) if v],
            "prof": on and r.epoch == self._epoch and host_phases,
            "timing": timing,
        }
        counts = [[k, v] for k, v in enumerate(r.n) if v]
        if counts:
            msg["n"] = counts
        tok = r.tok_fwd or r.tok_in
        if tok:
            msg["tok"] = tok
        if r.end_kind == _END_OPTIM:
            msg["m"] = {"step": r.opt_steps}
        if self._server:
            for end, acc in device_steps:
                self._server.broadcast(
                    {
                        "t": protocol.STEP,
                        "th": r.id,
                        "end": end,
                        "wall": sum(acc.values()),
                        "ph": [[k, v] for k, v in sorted(acc.items()) if v and k >= 0],
                        "prof": True,
                        "timing": TIMING_OF["Events"],
                        "steps": 0,
                    }
                )
            self._server.broadcast(msg)
        while self.paused and not self._closed.is_set():
            time.sleep(0.05)
        # The next step starts in the phase this one ended in (a put ends a step inside
        # push_wait's caller; the stack is kept).
        now = _mono()
        r.acc = [0] * len(r.acc)
        r.n = [0] * len(r.n)
        r.tok_fwd = r.tok_in = 0
        r.epoch = self._epoch
        r.last = r.step_start = now

    # -- GPU timing (threads on a CUDA device) -------------------------------------------------------

    def _gpu_mark(self, r: _Rec, k: int, now: int) -> int:
        torch = self._torch
        if self.gpu_timing == "Sync":
            torch.cuda.synchronize()
            return _mono()
        if self.gpu_timing == "Events":
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            r.events.append((k, ev))
        return now

    def _gpu_end_step(self, r: _Rec, host_end: int) -> List[Tuple[int, Dict[int, int]]]:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        r.events.append((r.cur, ev))
        if len(r.events) > 1:
            r.pending.append((host_end, r.events))
        r.events = [(r.cur, ev)]
        done = []
        while r.pending and r.pending[0][1][-1][1].query():
            end, evs = r.pending.pop(0)
            acc: Dict[int, int] = {}
            for (k, a), (_, b) in zip(evs, evs[1:]):
                acc[k] = acc.get(k, 0) + int(a.elapsed_time(b) * 1e6)
            done.append((end, acc))
        return done

    # -- queues ----------------------------------------------------------------------------------

    def _qstats(self, q: "queue_module.Queue[Any]") -> Optional[_QStats]:
        st = q.__dict__.get("_dft")
        if st is None:
            if q.__dict__.get("_dft_skip"):
                return None
            with self._lock:
                st = q.__dict__.get("_dft")
                if st is None:
                    st = q.__dict__["_dft"] = _QStats(q)
        return st  # type: ignore[no-any-return]

    def _queue_side(self, st: _QStats, r: _Rec, producer: bool) -> None:
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
        with self._lock:
            st.qid = len(self._queues)
            self._queues.append(st)
            self._edges.append((st.producer, st.consumer))
            self._reorder()
            self._table_changed()
            if self._server:
                n = sum(1 for o in self._queues if o.producer == st.producer)
                name = "%s>%s" % (st.producer, st.consumer)
                if n > 1:
                    name += "#%d" % n
                self._server.declare(
                    {
                        "t": protocol.QUEUE,
                        "id": st.qid,
                        "name": name,
                        "capacity": st.maxsize if st.maxsize > 0 else 1 << 30,
                        "producer": st.producer,
                        "consumer": st.consumer,
                    }
                )

    # -- viewer commands and samples ----------------------------------------------------------------

    def _command(self, c: Dict[str, Any]) -> None:
        kind, value = c.get("cmd"), c.get("value")
        if kind == protocol.SET_PROFILING:
            self.on = bool(value)
            self._epoch += 1
        elif kind == protocol.SET_GPU_TIMING and value in TIMING_OF:
            self.gpu_timing = value
        elif kind == protocol.SET_PAUSED:
            self.paused = bool(value)
        elif kind == protocol.CHECKPOINT and self._server:
            self._server.control(
                {"t": protocol.STATUS, "text": "zero-code mode cannot checkpoint the script"}
            )

    def _sample(self) -> Dict[str, Any]:
        now = _mono()
        other = len(self._phases)
        live = []
        for r in list(self._threads):
            acc = [[k, v] for k, v in enumerate(r.acc) if v]
            cur = r.cur if r.cur >= 0 else other
            live.append({"th": r.id, "ph": cur, "ps": r.last, "ss": r.step_start, "acc": acc})
        return {
            "t": protocol.SAMPLE,
            "now": now,
            "prof": self.on,
            "timing": self.gpu_timing,
            "paused": self.paused,
            "dropped": 0,
            "live": live,
            "q": [q.read(now) for q in list(self._queues)],
        }

    def _sample_loop(self) -> None:
        tick = 0.1
        nxt = time.monotonic() + tick
        while not self._closed.wait(max(0.0, nxt - time.monotonic())):
            nxt += tick
            server = self._server
            if server is not None and server.viewers():
                server.broadcast(self._sample())

    def close(self) -> None:
        """Stops serving, removes the socket and the hooks."""
        self._closed.set()
        sampler = getattr(self, "_sampler", None)
        if sampler is not None:
            sampler.join(timeout=1)
        if self._server:
            self._server.close()
            self._server = None
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _measure(self, n: int = 20000) -> float:
        """ns per phase change (enter + leave), as the viewer's self-cost line shows it."""
        r = _Rec(-1, "measure", "measure", _mono(), 0, False)
        k = self._phase_idx[SYNC]
        t0 = _mono()
        for _ in range(n // 2):
            self.enter(r, k)
            self.leave(r)
        return (_mono() - t0) / n

    # -- the hooks -----------------------------------------------------------------------------------

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        own = name in owner.__dict__
        orig = getattr(owner, name)
        kept = owner.__dict__[name] if own else None
        setattr(owner, name, make(orig))

        def undo() -> None:
            if own:
                setattr(owner, name, kept)
            else:
                delattr(owner, name)

        self._undo.append(undo)

    def install(self) -> None:
        """Installs the queue wraps, and PyTorch's hooks and wraps when torch is importable."""
        self._install_queue()
        try:
            import torch  # type: ignore
        except ImportError:
            return
        self._torch = torch
        self._install_torch(torch)

    def _install_queue(self) -> None:
        a = self
        Q = queue_module.Queue

        def wrap_put(orig: Any) -> Any:
            def put(self: Any, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
                r = a._rec()
                st = a._qstats(self) if r is not None else None
                if st is None or r is None:
                    return orig(self, item, block, timeout)
                try:
                    orig(self, item, False)
                except queue_module.Full:
                    if not block:
                        raise
                    wait(st, st.pushers, "push_wait", r, a._phase_idx[PUSH_WAIT],
                         lambda: orig(self, item, True, timeout))
                a._queue_side(st, r, True)
                a.step_event(r, _END_PUT)

            return put

        def wrap_get(orig: Any) -> Any:
            def get(self: Any, block: bool = True, timeout: Optional[float] = None) -> Any:
                r = a._rec()
                st = a._qstats(self) if r is not None else None
                if st is None or r is None:
                    return orig(self, block, timeout)
                try:
                    item = orig(self, False)
                except queue_module.Empty:
                    if not block:
                        raise
                    item = wait(st, st.poppers, "pop_wait", r, a._phase_idx[POP_WAIT],
                                lambda: orig(self, True, timeout))
                a._queue_side(st, r, False)
                return item

            return get

        def wait(st: _QStats, waiting: List[int], total: str, r: _Rec, k: int,
                 call: Callable[[], Any]) -> Any:
            with st.lock:
                start = _mono()
                st.advance(start, st.depth)
                waiting[0] += 1
                waiting[1] += st.at
                start = st.at
            a.enter(r, k)
            try:
                return call()
            finally:
                a.leave(r)
                with st.lock:
                    now = max(_mono(), st.at)
                    waiting[0] -= 1
                    waiting[1] -= start
                    setattr(st, total, getattr(st, total) + now - start)

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

        self._patch(Q, "put", wrap_put)
        self._patch(Q, "get", wrap_get)
        self._patch(Q, "_put", wrap_inner_put)
        self._patch(Q, "_get", wrap_inner_get)

    def _install_torch(self, torch: Any) -> None:
        a = self
        from torch.nn.modules import module as nn_module

        def pre(module: Any, args: Any) -> None:
            r = a._rec()
            if r is None:
                return
            if r.depth == 0:
                k = a._module_phase.get(type(module))
                if k is None:
                    k = a._module_phase[type(module)] = a._phase(type(module).__name__[:MAX_NAME])
                    a._settled = 0
                if module not in a._tops:
                    a._tops.add(module)
                    a._settled = 0
                a.enter(r, k)
            r.depth += 1

        def post(module: Any, args: Any, kwargs: Any, output: Any = None) -> None:
            r = a._rec()
            if r is None or r.depth == 0:
                return
            r.depth -= 1
            if r.depth == 0:
                a.leave(r)
                r.tok_fwd += _tokens(torch, args, kwargs)
                a.step_event(r, _END_FORWARD)

        def settle() -> None:
            """Once the top-level modules are known, they keep hooks of their own and the
            global ones go: a global hook sends every module call of the process down
            PyTorch's slow path (about 5 us a call), an instance hook only the top-level one."""
            handles = []
            for m in list(a._tops):
                handles.append(m.register_forward_pre_hook(pre))
                handles.append(
                    m.register_forward_hook(post, with_kwargs=True, always_call=True)
                )
            for h in global_handles:
                h.remove()
            self._undo += [h.remove for h in handles]

        global_handles = [
            nn_module.register_module_forward_pre_hook(pre),
            nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True),
        ]
        self._undo += [h.remove for h in global_handles]
        self._settle = settle

        def timed(k_name: str, orig: Any) -> Any:
            k = a._phase_idx[k_name]

            def call(*args: Any, **kwargs: Any) -> Any:
                r = a._rec()
                if r is None or r.cur == k:
                    return orig(*args, **kwargs)
                a.enter(r, k)
                try:
                    return orig(*args, **kwargs)
                finally:
                    a.leave(r)

            call.__wrapped__ = orig  # type: ignore[attr-defined]
            call.__name__ = getattr(orig, "__name__", k_name)
            call.__doc__ = getattr(orig, "__doc__", None)
            return call

        self._patch(torch.Tensor, "backward", lambda o: timed(BACKWARD, o))
        self._patch(torch.autograd, "backward", lambda o: timed(BACKWARD, o))
        for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
            self._patch(owner, "clip_grad_norm_", lambda o: timed(CLIP, o))
        for name in ("item", "tolist", "cpu", "nonzero"):
            self._patch(torch.Tensor, name, lambda o: timed(SYNC, o))
        self._patch(torch, "nonzero", lambda o: timed(SYNC, o))
        self._patch(torch.cuda, "synchronize", lambda o: timed(SYNC, o))
        from torch.utils.data import dataloader

        self._patch(dataloader._BaseDataLoaderIter, "__next__", lambda o: timed(DATA_WAIT, o))

        optim_k = self._phase_idx[OPTIM]

        def opt_pre(opt: Any, args: Any, kwargs: Any) -> None:
            r = a._rec()
            if r is not None:
                a.enter(r, optim_k)

        def opt_post(opt: Any, args: Any, kwargs: Any) -> None:
            r = a._rec()
            if r is None:
                return
            a.leave(r)
            r.opt_steps += 1
            a.step_event(r, _END_OPTIM)

        from torch.optim import optimizer as optim_module

        h3 = optim_module.register_optimizer_step_pre_hook(opt_pre)
        h4 = optim_module.register_optimizer_step_post_hook(opt_post)
        self._undo += [h3.remove, h4.remove]


_COUNTED_IDX = frozenset(BASE_PHASES.index(p) for p in COUNTED)


def _tokens(torch: Any, args: Any, kwargs: Any) -> int:
    """Tokens of a top-level forward: its `input_ids`, else its first integer tensor argument."""
    t = kwargs.get("input_ids") if kwargs else None
    if t is None:
        for x in args or ():
            if isinstance(x, torch.Tensor):
                t = x
                break
    if isinstance(t, torch.Tensor) and t.dim() >= 1 and not t.is_floating_point():
        return int(t.numel())
    return 0


_AUTO: Optional[Auto] = None


def auto(serve: bool = True, path: Optional[str] = None) -> Auto:
    """Instruments this process (once; later calls return the same instance) and serves its
    telemetry for `dflash-top attach`."""
    global _AUTO
    if _AUTO is None:
        _AUTO = Auto(serve=serve, path=path)
        _AUTO.install()
    return _AUTO
