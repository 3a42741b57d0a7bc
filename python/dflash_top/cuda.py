"""GPU timing of threads registered on a `cuda` device: a synchronize at each mark (`Sync`), or a
CUDA event at each mark whose device times are read back once the step's events completed
(`Events`), steps later, without stalling the thread. torch is imported only when a thread asks
for a `cuda` device."""

import time
from typing import Any, List, Tuple

from .threads import ThreadRecord

__all__ = ["CudaTiming"]

_mono = time.monotonic_ns


class CudaTiming:
    def __init__(self) -> None:
        self._torch: Any = None  # None: not looked for yet; False: no torch or no CUDA

    def available(self) -> bool:
        if self._torch is None:
            try:
                import torch  # type: ignore

                self._torch = torch if torch.cuda.is_available() else False
            except ImportError:
                self._torch = False
        return bool(self._torch)

    def mark(self, r: ThreadRecord, k: int, now: int, mode: str) -> int:
        """Phase `k` starts on thread `r` at host time `now`; returns the time to book it at."""
        if mode == "Sync":
            self._torch.cuda.synchronize()
            return _mono()
        if mode == "Events":
            # Each event starts phase k on the device; the next one ends it.
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            r.events.append((k, ev))
        return now

    def end_step(self, r: ThreadRecord, host_end: int) -> List[Tuple[int, List[int]]]:
        """Closes the step's events; returns (host end, device ns per phase) of the earlier
        steps whose events are done, oldest first."""
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        r.events.append((r.other, ev))
        if len(r.events) > 1:
            r.pending.append((host_end, r.events))
        r.events = [(r.other, ev)]
        done = []
        while r.pending and r.pending[0][1][-1][1].query():
            end, evs = r.pending.pop(0)
            acc = [0] * len(r.acc)
            for (k, a), (_, b) in zip(evs, evs[1:]):
                acc[k] += int(a.elapsed_time(b) * 1e6)
            done.append((end, acc))
        return done
