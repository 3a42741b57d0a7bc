"""What the zero-code mode's parts share: the phase names it starts with, the viewer's limits,
and the kinds of step end (python/dflash_top/auto/session.py holds the instrumentation itself)."""

import time

from ..protocol import POP_WAIT, PUSH_WAIT

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
