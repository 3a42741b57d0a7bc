"""GPU timing of threads registered on a `cuda` device: a synchronize at each mark (`Sync`), or a
CUDA event at each mark whose device times are read back once the step's events completed
(`Events`), steps later, without stalling the thread. torch is imported only when a thread asks
for a `cuda` device.

And the caching allocator's figures of the devices the threads declared, for the samples
(`read_alloc`): read only when the pipeline imported torch and initialised CUDA itself.

This module imports only the protocol's constants: a thread's record is anything `Timed`."""

import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Protocol, Tuple

from .protocol import MAX_COUNT, MAX_CUDA_DEVICES, MEMORY_STATS_KEYS

__all__ = ["CudaTiming", "Timed", "cuda_index", "alloc_entry", "read_alloc"]

_mono = time.monotonic_ns


class Timed(Protocol):
    """What GPU timing keeps on a thread's record (a `ThreadRecord`): the CUDA events of the
    step in progress, `(phase, event)`, and of ended steps not yet complete on the device,
    `(host end, events)`."""

    events: List[Tuple[int, Any]]
    pending: List[Tuple[int, List[Tuple[int, Any]]]]


class CudaTiming:
    def __init__(self) -> None:
        self._torch: Any = None  # None: not looked for yet; False: no torch or no CUDA
        # What `Sync` calls; None: torch.cuda.synchronize as it is at the call.
        self._synchronize: Optional[Callable[[], None]] = None

    def use(self, torch: Any, synchronize: Callable[[], None]) -> None:
        """Times with `torch` (imported by the caller) and syncs with `synchronize` (zero-code
        mode passes torch's own, before its wrap: a wrapped one would count this sync as the
        script's, and recurse)."""
        self._torch = torch
        self._synchronize = synchronize

    def available(self) -> bool:
        if self._torch is None:
            try:
                import torch

                self._torch = torch if torch.cuda.is_available() else False
            except ImportError:
                self._torch = False
        return bool(self._torch)

    def mark(self, r: Timed, k: int, now: int, mode: str) -> int:
        """Phase `k` starts on thread `r` at host time `now`; returns the time to book it at."""
        if mode == "Sync":
            if self._synchronize is not None:
                self._synchronize()
            else:
                self._torch.cuda.synchronize()
            return _mono()
        if mode == "Events":
            # Each event starts phase k on the device; the next one ends it.
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            r.events.append((k, ev))
        return now

    def end_step(self, r: Timed, host_end: int, k: int) -> List[Tuple[int, Dict[int, int]]]:
        """Closes the step's events (the next step starts in phase `k`); returns (host end,
        device ns by phase) of the earlier steps whose events are done, oldest first."""
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        r.events.append((k, ev))
        if len(r.events) > 1:
            r.pending.append((host_end, r.events))
        r.events = [(k, ev)]
        done = []
        while r.pending and r.pending[0][1][-1][1].query():
            end, evs = r.pending.pop(0)
            acc: Dict[int, int] = {}
            for (j, a), (_, b) in zip(evs, evs[1:]):
                acc[j] = acc.get(j, 0) + int(a.elapsed_time(b) * 1e6)
            done.append((end, acc))
        return done


# -- the caching allocator ----------------------------------------------------------------------


def cuda_index(device: str) -> Optional[int]:
    """The N of a declared `cuda:N` (`cuda` alone: 0, torch's device unless the script set
    another); None for any other device."""
    if device == "cuda":
        return 0
    head, _, n = device.partition(":")
    if head != "cuda" or not n.isdigit():
        return None
    return int(n)


def alloc_entry(cuda: int, stats: Mapping[str, Any]) -> Optional[Dict[str, int]]:
    """One entry of a sample's `alloc`: device `cuda`'s figures from `torch.cuda.memory_stats`
    (`stats`), each within the protocol's bounds; None when `stats` lacks one (CUDA not
    initialised: an empty dict)."""
    out = {"cuda": cuda}
    for field, key in MEMORY_STATS_KEYS.items():
        v = stats.get(key)
        if v is None:
            return None
        out[field] = min(max(int(v), 0), MAX_COUNT)
    return out


def read_alloc(devices: Iterable[int]) -> List[Dict[str, int]]:
    """The `alloc` entries of `devices`, when torch is imported and CUDA initialised; none
    otherwise. Never imports torch nor initialises CUDA, and never raises: a device that
    cannot be read is left out."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return []
    except Exception:  # noqa: BLE001 - a half-imported or unusual torch: no figures
        return []
    out: List[Dict[str, int]] = []
    for d in sorted(set(devices)):
        if d >= MAX_CUDA_DEVICES:
            continue
        try:
            entry = alloc_entry(d, cuda.memory_stats(d))
        except Exception:  # noqa: BLE001 - reading never breaks the pipeline
            continue
        if entry is not None:
            out.append(entry)
    return out
