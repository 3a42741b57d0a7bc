"""Host syncs by call site: the first frame of the caller outside torch, the standard library
and this package (`file:line`), with the op (`.item()`, `.cpu()`, `synchronize`, ...), a count
and a total time per site. Memory is bounded: MAX_KEPT sites a thread, later ones summed as
`other`; TOP of them are sent (by time), the rest summed as `other`."""

import os
import sysconfig
from typing import Any, Dict, List, Tuple

#: Sites a thread keeps; later new sites count as `other`.
MAX_KEPT = 256
#: Sites a thread's sample carries, by time (the rest summed as one `other` entry).
TOP = 32
OTHER = ("other", 0, "")

_SKIP_DIRS = tuple(
    os.path.realpath(d) + os.sep
    for d in {
        sysconfig.get_paths().get("stdlib", ""),
        sysconfig.get_paths().get("platstdlib", ""),
        os.path.dirname(os.path.abspath(__file__)),
    }
    if d
)
_skip: Dict[str, bool] = {}
_names: Dict[str, str] = {}


def _skipped(filename: str) -> bool:
    """Whether frames of `filename` are torch's, the standard library's or ours."""
    s = _skip.get(filename)
    if s is None:
        path = os.path.realpath(filename) if not filename.startswith("<") else filename
        s = (
            path.startswith(_SKIP_DIRS)
            or (os.sep + "torch" + os.sep) in path
            or filename.startswith("<frozen")
        )
        _skip[filename] = s
    return s


def site_of(frame: Any) -> Any:
    """The first frame from `frame` outward that is the script's (or None)."""
    f = frame
    while f is not None and _skipped(f.f_code.co_filename):
        f = f.f_back
    return f


def note(sites: Dict[Any, List[int]], frame: Any, op: str, ns: int) -> None:
    """Counts a sync `op` of `ns` called from `frame` in a thread's `sites`."""
    f = site_of(frame)
    key: Tuple[Any, int, str] = (f.f_code, f.f_lineno, op) if f is not None else OTHER
    v = sites.get(key)
    if v is None:
        if len(sites) >= MAX_KEPT:
            key = OTHER
            v = sites.get(key)
        if v is None:
            v = sites[key] = [0, 0]
    v[0] += 1
    v[1] += ns


def name_of(filename: str) -> str:
    """`train.py`, `pkg/train.py`: a file as a site names it (relative to the working
    directory when under it, else its last two parts)."""
    n = _names.get(filename)
    if n is None:
        rel = os.path.relpath(filename) if os.path.isabs(filename) else filename
        if rel.startswith(".."):
            rel = os.sep.join(filename.split(os.sep)[-2:])
        n = _names[filename] = rel
    return n


def top(sites: Dict[Any, List[int]]) -> List[List[Any]]:
    """A thread's sites as sent: `[["file:line", op, count, ns], ...]`, the TOP by time, the
    rest (and those past MAX_KEPT) summed as `["other", "", count, ns]`."""
    rows = sorted(sites.copy().items(), key=lambda kv: -kv[1][1])
    out: List[List[Any]] = []
    rest = [0, 0]
    for (code, line, op), (n, ns) in rows:
        if code == "other" or len(out) >= TOP:
            rest[0] += n
            rest[1] += ns
            continue
        out.append(["%s:%d" % (name_of(code.co_filename), line), op, n, ns])
    if rest[0]:
        out.append(["other", "", rest[0], rest[1]])
    return out
