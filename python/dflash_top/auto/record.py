"""Zero-code mode's record of a thread: its step in progress (time per phase, the phase now, the
host syncs counted), what its forwards and queue items brought, how its steps end, the CUDA
events of its GPU timing and the losses being read without a host sync."""

from typing import Any, Dict, List, Tuple

from .common import _END_NONE

__all__ = ["_Rec"]


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
