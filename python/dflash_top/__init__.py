"""dflash_top: watch a Python pipeline live with `dflash-top attach`.

    prof = Profiler(["producer", ("consumer", ["forward", "backward"])])
    q = prof.queue(queue.Queue(maxsize=8), "batches")   # between producer and consumer
    # in each worker thread:
    prof.thread("consumer")
    with prof.phase("forward"): ...
    prof.mark("backward"); ...
    prof.end_step(tokens=n, loss=loss)

Modules by job: `profiler` (the Profiler), `threads` (per-thread recorders), `queues` (measured
queues), `cuda` (GPU timing), `wire` (framing and sockets), `protocol` (the protocol's
constants), `serve` (the socket server), `auto` (zero-code mode: `dflash_top.auto()` or
`python -m dflash_top run script.py`). This module only re-exports the public names.
"""

from .auto import Auto, auto
from .profiler import Profiler, StageSpec
from .protocol import VERSION as PROTOCOL_VERSION
from .protocol import __version__
from .queues import ProfiledQueue
from .threads import Phase, ThreadRecord
from .wire import WireError

__all__ = [
    "auto",
    "Auto",
    "Profiler",
    "ProfiledQueue",
    "Phase",
    "ThreadRecord",
    "StageSpec",
    "WireError",
    "PROTOCOL_VERSION",
]
