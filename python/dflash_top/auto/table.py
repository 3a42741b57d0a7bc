"""Zero-code mode's stage table: a thread's stage by its name, and the stages' chain order from
the queues between them."""

import re
from typing import Iterable, List, Sequence, Tuple

from .common import MAX_NAME

__all__ = ["stage_of", "chain_order"]


def stage_of(thread_name: str) -> str:
    """The stage of a thread by its name: `target-0` -> `target`, `MainThread` -> `main`,
    `Thread-3 (worker)` -> `worker`."""
    if thread_name == "MainThread":
        return "main"
    m = re.fullmatch(r"Thread-\d+ \((.+)\)", thread_name)
    if m:
        return m.group(1)[:MAX_NAME]
    base = re.sub(r"[-_.:# ]?\d+$", "", thread_name)
    if re.fullmatch(r"Thread", base) or not base:
        return "thread"
    return base[:MAX_NAME]


def chain_order(
    stages: Sequence[str], edges: Iterable[Tuple[str, str]], carries: Iterable[str]
) -> List[str]:
    """Stages in chain order: upstream of a queue (an `edges` pair: producer, consumer) before
    downstream; of stages free to go next, one whose steps bring no tokens (not in `carries`)
    first (the viewer counts tokens at the last stage: a helper thread such as autograd's never
    ends the chain); ties: first seen."""
    edges = list(edges)
    carries = set(carries)
    order: List[str] = []
    left = list(stages)
    while left:
        ready = [s for s in left if not any(c == s and p in left for p, c in edges)]
        ready.sort(key=lambda s: s in carries)
        pick = ready[0] if ready else left[0]
        order.append(pick)
        left.remove(pick)
    return order
