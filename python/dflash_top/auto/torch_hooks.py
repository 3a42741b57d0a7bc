"""Zero-code mode's PyTorch hooks: each top-level module's forward as a phase named by its class,
`backward`, `clip`, `optim`, host syncs (`sync`) and DataLoader waits (`data_wait`); tokens per
step from a forward's `input_ids` (python/dflash_top/auto/session.py installs them)."""

import dataclasses
import sys
from collections.abc import Mapping
from typing import Any, Callable, Optional

from . import loss
from .common import (
    _END_FORWARD,
    _END_OPTIM,
    BACKWARD,
    CLIP,
    DATA_WAIT,
    MAX_NAME,
    OPTIM,
    SYNC,
    _mono,
)


def install(a: Any, torch: Any) -> None:
    """PyTorch's hooks and wraps: top-level module forwards by class, backward, clip, optimizer
    steps, host syncs and DataLoader waits."""
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
            r.top = module
        r.depth += 1

    def post(module: Any, args: Any, kwargs: Any, output: Any = None) -> None:
        r = a._rec()
        if r is None or r.depth == 0:
            return
        # The top-level module's own post ends its forward whatever the depth says: when
        # another thread settles (the global hooks give way to the top modules' own) while
        # this one is inside a nested module, that module's global post never comes, and
        # counting down alone would leave the depth above zero for good.
        if module is not r.top:
            r.depth = max(1, r.depth - 1)
            return
        r.depth = 0
        r.top = None
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
        a._undo += [h.remove for h in handles]

    global_handles = [
        nn_module.register_module_forward_pre_hook(pre),
        nn_module.register_module_forward_hook(post, with_kwargs=True, always_call=True),
    ]
    a._undo += [h.remove for h in global_handles]
    a._settle = settle

    def timed(k_name: str, orig: Any, first: Optional[Callable[..., None]] = None) -> Any:
        """`orig` timed as phase `k_name` (not again inside itself); `first(r, args, kwargs)`
        runs before the phase starts."""
        k = a._phase_idx[k_name]

        def call(*args: Any, **kwargs: Any) -> Any:
            r = a._rec()
            if r is None or r.cur == k:
                return orig(*args, **kwargs)
            if first is not None:
                first(r, args, kwargs)
            a.enter(r, k)
            try:
                return orig(*args, **kwargs)
            finally:
                a.leave(r)

        call.__wrapped__ = orig  # type: ignore[attr-defined]
        call.__name__ = getattr(orig, "__name__", k_name)
        call.__doc__ = getattr(orig, "__doc__", None)
        return call

    def keep_loss(r: Any, args: Any, kwargs: Any) -> None:
        """The tensor `backward` is called on, kept as the step's loss (read without a host
        sync: loss.keep)."""
        t = args[0] if args else kwargs.get("tensors")
        if isinstance(t, (list, tuple)) and len(t) == 1:
            t = t[0]
        if isinstance(t, torch.Tensor):
            loss.keep(torch, r, t)

    a._patch(torch.Tensor, "backward", lambda o: timed(BACKWARD, o, keep_loss))
    a._patch(torch.autograd, "backward", lambda o: timed(BACKWARD, o, keep_loss))
    for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
        a._patch(owner, "clip_grad_norm_", lambda o: timed(CLIP, o))
    sync_k = a._phase_idx[SYNC]

    def sync(op: str, orig: Any) -> Any:
        """A host sync `op`: the `sync` phase, counted, and kept by its call site (the first
        frame outside torch and the standard library) where `Auto.sites` is on."""

        def call(*args: Any, **kwargs: Any) -> Any:
            r = a._rec()
            if r is None or r.cur == sync_k:
                return orig(*args, **kwargs)
            a.enter(r, sync_k)
            t0 = _mono()
            try:
                return orig(*args, **kwargs)
            finally:
                ns = _mono() - t0
                a.leave(r)
                if a.sites:
                    a.note_site(r, sys._getframe(1), op, ns)

        call.__wrapped__ = orig  # type: ignore[attr-defined]
        call.__name__ = getattr(orig, "__name__", op)
        call.__doc__ = getattr(orig, "__doc__", None)
        return call

    for name in ("item", "tolist", "cpu", "nonzero"):
        a._patch(torch.Tensor, name, lambda o, n=name: sync("." + n + "()", o))
    a._patch(torch, "nonzero", lambda o: sync("nonzero", o))
    a._patch(torch.cuda, "synchronize", lambda o: sync("synchronize", o))
    from torch.utils.data import dataloader

    a._patch(dataloader._BaseDataLoaderIter, "__next__", lambda o: timed(DATA_WAIT, o))

    def workers_told(orig: Any) -> Any:
        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, *args, **kwargs)
            r = a._rec()
            n = len(getattr(self, "_workers", ()) or ())
            if r is not None and n:
                a.tell(
                    "%s's DataLoader runs %d worker processes: their CPU is theirs, not this "
                    "session's (not shown); the wait for their batches is %s's data_wait"
                    % (r.name, n, r.name)
                )

        init.__wrapped__ = orig  # type: ignore[attr-defined]
        return init

    a._patch(dataloader._MultiProcessingDataLoaderIter, "__init__", workers_told)

    optim_k = a._phase_idx[OPTIM]

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
    a._undo += [h3.remove, h4.remove]


def _tokens(torch: Any, args: Any, kwargs: Any) -> int:
    """Tokens of a top-level forward: its `input_ids` (an argument, or a key or field of a
    dict, tuple or dataclass batch it is given), else its first integer tensor argument."""
    kw = kwargs or {}
    t = kw.get("input_ids")
    if not _is_ids(torch, t):
        t = _ids(torch, args or (), 0)
    if t is None:
        t = _ids(torch, kw, 0)
    if t is None:
        return 0
    return int(t.numel())


def _is_ids(torch: Any, x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dim() >= 1 and not x.is_floating_point() \
        and x.dtype is not torch.bool


def _ids(torch: Any, x: Any, depth: int) -> Any:
    """The token ids in `x`: its `input_ids` entry or field where it has one, else its first
    integer tensor (searched two levels into dicts, sequences and dataclasses)."""
    if isinstance(x, torch.Tensor):
        return x if _is_ids(torch, x) else None
    if depth > 2:
        return None
    if isinstance(x, Mapping):
        items: Any = x.values()
        named = x.get("input_ids")
    elif isinstance(x, (list, tuple)):
        items, named = x, getattr(x, "input_ids", None)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        items = [getattr(x, f.name, None) for f in dataclasses.fields(x)]
        named = getattr(x, "input_ids", None)
    else:
        return None
    if _is_ids(torch, named):
        return named
    for v in items:
        t = _ids(torch, v, depth + 1)
        if t is not None:
            return t
    return None
