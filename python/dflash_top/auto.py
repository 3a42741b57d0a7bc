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
Samples carry the caching allocator's figures of the CUDA devices the threads run on
(`torch.cuda.memory_stats`).
"""

import math
import os
import re
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from . import auto_queue, auto_torch, protocol, sites, wire
from .job import job_tag
from .auto_common import (
    _END_NONE,
    _END_OPTIM,
    BASE_PHASES,
    BUILTIN_PHASES,
    COUNTED,
    MAX_NAME,
    MAX_STAGES,
    N_CUSTOM,
    SETTLE_STEPS,
    SYNC,
    _mono,
)
from .producer import Producer
from .protocol import TIMING_OF
from .serve import Server

__all__ = ["Auto", "auto", "stage_of"]


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
        "id", "name", "stage", "acc", "n", "cur", "last", "step_start", "stack", "depth", "top",
        "tok_fwd", "tok_in", "end_kind", "opt_steps", "epoch", "gpu", "events", "pending",
        "steps", "losses", "loss_free", "sites",
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
        # The top-level module whose forward runs now (its own post hook ends it).
        self.top: Any = None
        self.tok_fwd = 0
        self.tok_in = 0
        self.end_kind = _END_NONE
        self.opt_steps = 0
        self.epoch = epoch
        self.gpu = gpu
        self.events: List[Tuple[int, Any]] = []
        self.pending: List[Tuple[int, List[Tuple[int, Any]]]] = []
        # Steps ended; the losses `backward` was called on, copied without a host sync:
        # (step, buffer, event or None), oldest first, and the buffers free for the next.
        self.steps = 0
        self.losses: List[Tuple[int, Any, Any]] = []
        self.loss_free: List[Any] = []
        # Host syncs by call site: (code, line, op) -> [count, ns] (python/dflash_top/sites.py).
        self.sites: Dict[Any, List[int]] = {}


class Auto(Producer):
    """The process-wide instrumentation: hooks installed by `install`, served as a `Profiler`
    is (both are `Producer`s). One per process (`auto()` makes it)."""

    def __init__(
        self,
        serve: bool = True,
        path: Optional[str] = None,
        gpu_timing: str = "Async",
        sync_sites: bool = True,
    ) -> None:
        if gpu_timing not in TIMING_OF:
            raise ValueError(
                "gpu_timing %r: use one of %s" % (gpu_timing, ", ".join(sorted(TIMING_OF)))
            )
        super().__init__(gpu_timing)
        # Whether host syncs are kept by call site (each costs a walk up the stack).
        self.sites = sync_sites
        self._tls = threading.local()
        self._lock = threading.RLock()
        self._phases: List[str] = list(BASE_PHASES)
        self._phase_idx: Dict[str, int] = {p: i for i, p in enumerate(self._phases)}
        self._module_phase: Dict[type, int] = {}
        # Top-level modules seen, and steps ended since the last new one: after SETTLE_STEPS,
        # the global module hooks give way to hooks on these modules (see auto_torch.install).
        self._tops: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._settled = 0
        self._settle: Optional[Callable[[], None]] = None
        self._stages: List[str] = []
        self._edges: List[Tuple[str, str]] = []
        # Stages whose steps brought tokens.
        self._carries: Set[str] = set()
        # The last optimizer step reported, and the tokens the last stage's steps brought.
        self._last_step: Optional[int] = None
        self._tokens = 0
        self._item: Any = None
        self._told: Set[str] = set()
        self._order: List[str] = []
        self._threads: List[_Rec] = []
        self._queues: List[auto_queue._QStats] = []
        self._torch: Any = None
        self._undo: List[Callable[[], None]] = []
        # When the stats file was last written, and the last stage's tokens then.
        self._seen = (0.0, 0)
        self.job = job_tag(os.environ)
        if serve:
            self._serve(path)
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        """In a child of `os.fork()` (a DataLoader worker, a script's own fork): the parent's
        session is not the child's, so nothing is recorded or served here, and the parent's
        socket is left to it at the child's exit."""
        self._closed.set()
        self._server = None
        self._tls = threading.local()

    # -- the table -------------------------------------------------------------------------------

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: stages in chain order, each with the shared phase list."""
        with self._lock:
            return [{"name": s, "phases": list(self._phases)} for s in self._order]

    def _reorder(self) -> None:
        """Stages in chain order: upstream of a queue before downstream; of stages free to go
        next, one whose steps bring no tokens first (the viewer counts tokens at the last stage:
        a helper thread such as autograd's never ends the chain); ties: first seen."""
        order: List[str] = []
        left = list(self._stages)
        while left:
            ready = [s for s in left if not any(c == s and p in left for p, c in self._edges)]
            ready.sort(key=lambda s: s in self._carries)
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
            self._declare_thread(r.id, t.name, stage, device)
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
            now = self._cuda.mark(r, k, now, self.gpu_timing)
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
        # The next step starts in the phase this one ends in.
        ph = [[k, v] for k, v in enumerate(r.acc) if v]
        msg, device_steps = self._step_record(r, now, ph, on, r.cur)
        counts = [[k, v] for k, v in enumerate(r.n) if v]
        if counts:
            msg["n"] = counts
        tok = r.tok_fwd or r.tok_in
        r.steps += 1
        if tok:
            msg["tok"] = tok
            if r.stage not in self._carries:
                with self._lock:
                    self._carries.add(r.stage)
                    self._reorder()
                    self._table_changed()
            if self._order and r.stage == self._order[-1]:
                self._tokens += tok
        loss = self._harvest_loss(r) if r.losses else None
        if r.end_kind == _END_OPTIM or loss is not None:
            m: Dict[str, Any] = {"step": r.opt_steps if r.end_kind == _END_OPTIM else r.steps}
            if loss is not None:
                m["loss"] = loss
            msg["m"] = m
            self._last_step = m["step"]
        # `other` is -1 here.
        self._send_step(r, msg, device_steps, -1)
        self._wait_while_paused()
        # The next step starts in the phase this one ended in (a put ends a step inside
        # push_wait's caller; the stack is kept).
        now = _mono()
        r.acc = [0] * len(r.acc)
        r.n = [0] * len(r.n)
        r.tok_fwd = r.tok_in = 0
        r.epoch = self._epoch
        r.last = r.step_start = now

    def tell(self, text: str) -> None:
        """A status line for the header, for the viewers attached now and later (once)."""
        with self._lock:
            if text in self._told:
                return
            self._told.add(text)
        if self._server:
            self._server.declare({"t": protocol.STATUS, "text": text})

    # -- host syncs by call site ---------------------------------------------------------------------

    def note_site(self, r: _Rec, frame: Any, op: str, ns: int) -> None:
        """A host sync `op` of `ns`, called from `frame`: counted at its call site."""
        sites.note(r.sites, frame, op, ns)

    # -- the loss, without a host sync ----------------------------------------------------------------

    def note_loss(self, r: _Rec, t: Any) -> None:
        """`backward` is called on `t`: a one-element float tensor is copied into a buffer of
        the thread's (pinned host memory for a CUDA tensor, copied without blocking, an event
        after it), read once the copy is done, at a later step's end (Auto._harvest_loss)."""
        torch = self._torch
        try:
            if t.numel() != 1 or not t.is_floating_point():
                return
            cuda = t.is_cuda
            if r.loss_free:
                buf = r.loss_free.pop()
            elif len(r.losses) < 4:
                buf = torch.empty((), dtype=torch.float32, pin_memory=cuda)
            else:
                return
            with torch.no_grad():
                buf.copy_(t.detach().reshape(()), non_blocking=cuda)
            ev = None
            if cuda:
                ev = torch.cuda.Event()
                ev.record()
            r.losses.append((r.steps, buf, ev))
        except Exception:  # noqa: BLE001 - reading the loss never breaks the script
            return

    def _harvest_loss(self, r: _Rec) -> Optional[float]:
        """The newest loss of an earlier step whose copy is done (never waiting on the device):
        a step's record carries the loss of the step before it."""
        value = None
        while r.losses and r.losses[0][0] < r.steps - 1:
            step, buf, ev = r.losses[0]
            if ev is not None and not ev.query():
                break
            r.losses.pop(0)
            v = float(self._item(buf))
            value = v if math.isfinite(v) else value
            r.loss_free.append(buf)
        return value

    # -- viewer commands and samples ----------------------------------------------------------------

    def _checkpoint(self) -> None:
        self.status("zero-code mode cannot checkpoint the script")

    def _live(self, with_sites: bool) -> List[Dict[str, Any]]:
        """Each thread's step; `with_sites`: with its host syncs by call site."""
        other = len(self._phases)
        live = []
        for r in list(self._threads):
            acc = [[k, v] for k, v in enumerate(r.acc) if v]
            cur = r.cur if r.cur >= 0 else other
            entry = {"th": r.id, "ph": cur, "ps": r.last, "ss": r.step_start, "acc": acc}
            if with_sites and r.sites:
                entry["sites"] = sites.top(r.sites)
                entry["steps"] = r.steps
            live.append(entry)
        return live

    def _queue_samples(self, now: int) -> List[Dict[str, int]]:
        return [q.read(now) for q in list(self._queues)]

    def _sample_loop(self) -> None:
        self._seen = (time.monotonic(), self._tokens)
        super()._sample_loop()

    def _each_second(self, server: Server) -> None:
        """Writes the stats file beside the socket (what `attach --list` shows without joining,
        and the job `attach --job` finds the ranks by): the optimizer step (else the last
        stage's steps), the tokens a second of the last stage since the previous write."""
        now, tokens = time.monotonic(), self._tokens
        step = self._last_step
        if step is None:
            last = self._order[-1] if self._order else None
            step = max([r.steps for r in list(self._threads) if r.stage == last] or [0])
        stats: Dict[str, Any] = {
            "step": step,
            "tok_per_s": (tokens - self._seen[1]) / max(1e-3, now - self._seen[0]),
            "viewers": server.viewers(),
        }
        if self.job is not None:
            stats["job"] = self.job
        wire.write_stats(server.path, stats)
        self._seen = (now, tokens)

    def close(self) -> None:
        """Stops serving, removes the socket and the hooks."""
        super().close()
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
        auto_queue.install(self)
        try:
            import torch  # type: ignore
        except ImportError:
            return
        self._torch = torch
        self._item = torch.Tensor.item
        self._cuda.use(torch, torch.cuda.synchronize)  # torch's own, before it is wrapped
        auto_torch.install(self, torch)

_COUNTED_IDX = frozenset(BASE_PHASES.index(p) for p in COUNTED)


_AUTO: Optional[Auto] = None


def auto(
    serve: bool = True,
    path: Optional[str] = None,
    gpu_timing: str = "Async",
    sync_sites: bool = True,
) -> Auto:
    """Instruments this process (once; later calls return the same instance) and serves its
    telemetry for `dflash-top attach`. `gpu_timing` is how CUDA threads' phases are timed at
    start (`Async`, `Sync` or `Events`; a viewer can switch it); `sync_sites`: whether host
    syncs are kept by call site."""
    global _AUTO
    if _AUTO is None:
        _AUTO = Auto(serve=serve, path=path, gpu_timing=gpu_timing, sync_sites=sync_sites)
        _AUTO.install()
    return _AUTO
