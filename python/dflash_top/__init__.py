"""dflash_top: watch a Python pipeline live with `dflash-top attach`.

    prof = Profiler(["producer", ("consumer", ["forward", "backward"])])
    q = prof.queue(queue.Queue(maxsize=8), "batches")   # between producer and consumer
    # in each worker thread:
    prof.thread("consumer")
    with prof.phase("forward"): ...
    prof.mark("backward"); ...
    prof.end_step(tokens=n, loss=loss)

Modules by job: `profiler` (the Profiler), `producer` (its base, shared with zero-code mode:
serving, samples, commands, step records, closing), `threads` (per-thread recorders), `queues`
(measured queues), `cuda` (GPU timing), `wire` (framing and sockets), `protocol` (the
protocol's constants), `serve` (the socket server), `auto` (zero-code mode: `dflash_top.auto()`
or `python -m dflash_top run script.py`). This module only re-exports the public names.

Imports go one way, down these floors (a module imports only modules of lower floors; no
import back up, not even for types: python/tests/test_layers.py checks it):

    protocol, job, sites               constants and helpers that know nothing else
    wire, threads, queues, cuda,       framing; per-thread records; measured queues and their
      auto.common                        counters; GPU timing; zero-code mode's names and limits
    serve, auto.table, auto.record,    the socket server; zero-code mode's stages, thread
      auto.queues                        records and queue wraps
    producer, auto.loss                what the Profiler and zero-code mode share (`Producer`);
                                         the loss read without a host sync
    auto.torch_hooks                   zero-code mode's PyTorch hooks
    profiler, auto.session             the Profiler; zero-code mode's `Auto`
    auto                               `auto()`, zero-code mode's entry
    __init__, __main__                 the public names; `python -m dflash_top run`

`threads` and `queues` work through what they need of a profiler (`threads.Marker`,
`queues.Waits`), and `cuda` through what it keeps on a thread's record (`cuda.Timed`), so
none of them imports the profiler.
"""

from .auto import Auto, auto
from .profiler import Profiler, StageSpec
from .protocol import VERSION as PROTOCOL_VERSION
from .protocol import __version__ as __version__
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
