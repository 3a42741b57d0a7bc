"""The wire protocol's constants, in one place (docs/protocol.md; src/wire/protocol.rs is the
reference, and python/tests/test_protocol_constants.py checks every value here against it).

The package's version is tied to the protocol's: `0.<protocol version>.<release>`.
"""

from typing import Dict, Tuple

# -- framing ------------------------------------------------------------------------------------

#: The 8 ASCII bytes that open the preamble each side sends first.
MAGIC: bytes = b"DFLSHTOP"
#: The protocol version, a little-endian u32 after the magic.
VERSION: int = 1
#: The preamble: magic, then the version (8 + 4 bytes).
PREAMBLE_LEN: int = 12
#: A frame: a little-endian u32 length, then that many bytes of one JSON object.
FRAME_HEADER_LEN: int = 4
#: The largest frame either side accepts, bytes.
MAX_FRAME: int = 1 << 20

#: This package's version: `0.<VERSION>.<release>` (pyproject.toml reads it from here).
__version__ = "0.1.0"

# -- message kinds (the `t` field) ----------------------------------------------------------------

HELLO = "hello"
THREAD = "thread"
QUEUE = "queue"
STEP = "step"
SAMPLE = "sample"
STATUS = "status"
DROPPED = "dropped"
COMMAND = "command"
REFUSED = "refused"

#: Every kind of this version, in protocol.rs's order.
KINDS: Tuple[str, ...] = (HELLO, THREAD, QUEUE, STEP, SAMPLE, STATUS, DROPPED, COMMAND, REFUSED)

# -- switches and timings -------------------------------------------------------------------------

#: GPU timing modes, as a `sample`'s `timing` and a `set_gpu_timing` command's value.
GPU_TIMINGS: Tuple[str, ...] = ("Async", "Sync", "Events")
#: How a step's phases were measured (a `step`'s `timing`): a CPU thread is `Host`.
TIMING_HOST = "Host"
#: The step timing of a GPU thread in each GPU timing mode.
TIMING_OF: Dict[str, str] = {"Async": "GpuAsync", "Sync": "GpuSync", "Events": "GpuEvents"}

# -- viewer to producer: commands (`{"t": "command", "cmd": {"cmd": NAME, "value": ...}}`) ------

SET_PROFILING = "set_profiling"
SET_GPU_TIMING = "set_gpu_timing"
SET_PAUSED = "set_paused"
RESET_WINDOWS = "reset_windows"
CHECKPOINT = "checkpoint"
#: A status line as a command (between a viewer's hub and a trainer; Python producers send the
#: `status` message instead).
STATUS_COMMAND = "status"

COMMANDS: Tuple[str, ...] = (
    SET_PROFILING,
    SET_GPU_TIMING,
    SET_PAUSED,
    RESET_WINDOWS,
    CHECKPOINT,
    STATUS_COMMAND,
)

# -- training numbers: the fields of a step's `m`, all optional ------------------------------------

#: A field left out is a value the pipeline never reported (shown as absent, not as zero).
METRICS: Tuple[str, ...] = (
    "loss",
    "tau",
    "lr",
    "grad_norm",
    "slot_acc",
    "block_size",
    "step",
    "skipped_nonfinite",
)
#: Block slots whose accuracy `slot_acc` holds, at most.
MAX_SLOTS: int = 16

# -- the caching allocator: a `sample`'s `alloc`, one entry per CUDA device -----------------------

#: The fields of an entry, in protocol.rs's order (`WireAlloc`): the device `cuda:N`, bytes
#: reserved and allocated now, segments held now, device allocations, device frees and
#: allocation retries in all.
ALLOC_FIELDS: Tuple[str, ...] = (
    "cuda",
    "reserved",
    "allocated",
    "segments",
    "allocs",
    "frees",
    "retries",
)
#: Fields of an entry a producer may leave out: `graphs`, the CUDA graphs our trainer captured
#: or released on the device (this client counts none, so it never sends it).
ALLOC_OPTIONAL: Tuple[str, ...] = ("graphs",)
#: Each field but `cuda`, as `torch.cuda.memory_stats(N)` names it (the figures libtorch's
#: `getDeviceStats` gives our trainer).
MEMORY_STATS_KEYS: Dict[str, str] = {
    "reserved": "reserved_bytes.all.current",
    "allocated": "allocated_bytes.all.current",
    "segments": "segment.all.current",
    "allocs": "num_device_alloc",
    "frees": "num_device_free",
    "retries": "num_alloc_retries",
}
#: Devices an `alloc` list may name: `cuda:0` to `cuda:63`.
MAX_CUDA_DEVICES: int = 64
#: The largest cumulative counter (or byte count) a viewer accepts.
MAX_COUNT: int = 1 << 62

# -- stage tables ---------------------------------------------------------------------------------

#: The phase a stage's threads are in when they mark none; implied, never declared.
OTHER = "other"
#: The queue waits a stage gets by its place in the chain.
POP_WAIT = "pop_wait"
PUSH_WAIT = "push_wait"
