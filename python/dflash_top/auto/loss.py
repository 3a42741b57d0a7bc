"""Zero-code mode reads the loss without a host sync: the one-element tensor `backward` is called
on is copied into a buffer of the thread's (pinned host memory for a CUDA tensor, copied without
blocking, an event recorded after it) and read once the copy is done, at a later step's end, so
a step's record carries the loss of the step before it."""

import math
from typing import Any, Callable, Optional

from .record import _Rec

__all__ = ["keep", "harvest"]

#: Losses a thread holds in flight at most (a later one is not kept until one is read).
IN_FLIGHT = 4


def keep(torch: Any, r: _Rec, t: Any) -> None:
    """`backward` is called on `t` in thread `r`: a one-element float tensor is copied, without
    blocking, for `harvest` to read later."""
    try:
        if t.numel() != 1 or not t.is_floating_point():
            return
        cuda = t.is_cuda
        if r.loss_free:
            buf = r.loss_free.pop()
        elif len(r.losses) < IN_FLIGHT:
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


def harvest(r: _Rec, item: Callable[[Any], Any]) -> Optional[float]:
    """The newest loss of an earlier step of thread `r` whose copy is done (never waiting on the
    device), read with `item` (torch's own `Tensor.item`: the wrapped one counts a sync)."""
    value = None
    while r.losses and r.losses[0][0] < r.steps - 1:
        step, buf, ev = r.losses[0]
        if ev is not None and not ev.query():
            break
        r.losses.pop(0)
        v = float(item(buf))
        value = v if math.isfinite(v) else value
        r.loss_free.append(buf)
    return value
