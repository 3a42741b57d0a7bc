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

The package's modules, one job each (imports go down this list; dflash_top/__init__.py has the
whole package's floors): `common` (phase names, the viewer's limits, kinds of step end),
`table` (a thread's stage, the chain order), `record` (a thread's record), `loss` (the loss
without a host sync), `queues` (the `queue.Queue` wraps), `torch_hooks` (PyTorch's hooks and
wraps), `session` (`Auto`: the process's instrumentation, served as a `Producer`); this module
makes the one `Auto` of the process (`auto()`).
"""

from typing import Optional

from .common import SYNC
from .record import _Rec
from .session import Auto
from .table import stage_of

__all__ = ["Auto", "auto", "stage_of", "SYNC", "_Rec"]

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
