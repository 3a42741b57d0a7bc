"""Zero-code mode's `Auto`: the process-wide instrumentation (python/dflash_top/auto/__init__.py
says what it records). Its threads, their phases and steps, the stage table it grows, the
samples and the stats file; the hooks are installed by `queues` and `torch_hooks`, serving is
the `Producer`'s."""

import os
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import protocol, sites, wire
from ..job import job_tag
from ..producer import Producer
from ..protocol import TIMING_OF
from ..serve import Server
from . import loss, queues, torch_hooks
from .common import (
    _END_OPTIM,
    BASE_PHASES,
    BUILTIN_PHASES,
    COUNTED,
    MAX_STAGES,
    N_CUSTOM,
    SETTLE_STEPS,
    SYNC,
    _mono,
)
from .record import _Rec
from .table import chain_order, stage_of

__all__ = ["Auto"]


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
        # the global module hooks give way to hooks on these modules (see torch_hooks.install).
        self._tops: weakref.WeakSet[Any] = weakref.WeakSet()
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
        self._queues: List[queues._QStats] = []
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

    # -- the table ---------------------------------------------------------------------------------

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: stages in chain order, each with the shared phase list."""
        with self._lock:
            return [{"name": s, "phases": list(self._phases)} for s in self._order]

    def _reorder(self) -> None:
        """The stages in chain order (table.chain_order)."""
        self._order = chain_order(self._stages, self._edges, self._carries)

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
        value = loss.harvest(r, self._item) if r.losses else None
        if r.end_kind == _END_OPTIM or value is not None:
            m: Dict[str, Any] = {"step": r.opt_steps if r.end_kind == _END_OPTIM else r.steps}
            if value is not None:
                m["loss"] = value
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

    # -- host syncs by call site -------------------------------------------------------------------

    def note_site(self, r: _Rec, frame: Any, op: str, ns: int) -> None:
        """A host sync `op` of `ns`, called from `frame`: counted at its call site."""
        sites.note(r.sites, frame, op, ns)

    # -- viewer commands and samples ---------------------------------------------------------------

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
                # The counts and the steps of one moment: the thread runs on while they are
                # read, so they are read again where a step ended meanwhile.
                for _ in range(3):
                    steps = r.steps
                    counted = sites.top(r.sites)
                    if r.steps == steps:
                        break
                entry["sites"] = counted
                entry["steps"] = steps
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

    # -- the hooks ---------------------------------------------------------------------------------

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
        queues.install(self)
        try:
            import torch
        except ImportError:
            return
        self._torch = torch
        self._item = torch.Tensor.item
        self._cuda.use(torch, torch.cuda.synchronize)  # torch's own, before it is wrapped
        torch_hooks.install(self, torch)


_COUNTED_IDX = frozenset(BASE_PHASES.index(p) for p in COUNTED)


