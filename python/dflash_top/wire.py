"""The dflash-top wire protocol (docs/protocol.md): a 12-byte preamble each way, then frames of
a 4-byte little-endian length and one JSON message. Standard library only; the constants live in
`dflash_top.protocol`."""

import json
import os
import socket
import struct
import tempfile
from typing import Any, Dict, Optional, Tuple

from .protocol import FRAME_HEADER_LEN, MAGIC, MAX_FRAME, PREAMBLE_LEN, VERSION

__all__ = [
    "MAGIC",
    "VERSION",
    "MAX_FRAME",
    "WireError",
    "preamble",
    "check_preamble",
    "frame",
    "unframe",
    "read_exact",
    "read_frame",
    "socket_dir",
    "socket_path",
]

Message = Dict[str, Any]


class WireError(Exception):
    """The other side broke the protocol; the message is a sentence that says how."""


def preamble(version: int = VERSION) -> bytes:
    return MAGIC + struct.pack("<I", version)


def check_preamble(b: bytes) -> None:
    """Raises WireError with a sentence when `b` is not our preamble of our version."""
    if len(b) != PREAMBLE_LEN or b[: len(MAGIC)] != MAGIC:
        raise WireError("the other side does not speak the dflash-top protocol")
    (theirs,) = struct.unpack("<I", b[len(MAGIC) :])
    if theirs != VERSION:
        raise WireError(
            "protocol version mismatch: this dflash_top speaks version %d, the other side "
            "version %d; use the same dflash-top release on both sides" % (VERSION, theirs)
        )


# Compact, and strict: NaN and infinities are not JSON (the viewer would reject the frame).
_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def frame(msg: Message) -> bytes:
    """One message as a frame: its length, then its JSON."""
    body = _dumps(msg).encode()
    return struct.pack("<I", len(body)) + body


def unframe(buf: bytes) -> Tuple[Optional[Message], int]:
    """The first message of `buf` and the bytes it took, or (None, 0) when `buf` does not hold
    a whole frame yet."""
    if len(buf) < FRAME_HEADER_LEN:
        return None, 0
    (n,) = struct.unpack("<I", buf[:FRAME_HEADER_LEN])
    if n > MAX_FRAME:
        raise WireError("a frame of %d bytes exceeds the limit of %d" % (n, MAX_FRAME))
    end = FRAME_HEADER_LEN + n
    if len(buf) < end:
        return None, 0
    return json.loads(buf[FRAME_HEADER_LEN:end]), end


def read_exact(sock: socket.socket, n: int) -> Optional[bytes]:
    """`n` bytes, or None when the peer closed the connection first."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(sock: socket.socket) -> Optional[Message]:
    """The next message, or None when the peer closed the connection."""
    head = read_exact(sock, FRAME_HEADER_LEN)
    if head is None:
        return None
    (n,) = struct.unpack("<I", head)
    if n > MAX_FRAME:
        raise WireError("a frame of %d bytes exceeds the limit of %d" % (n, MAX_FRAME))
    body = read_exact(sock, n)
    if body is None:
        return None
    msg: Message = json.loads(body)
    return msg


def stats_path(socket_path: str) -> str:
    """`<pid>.info` beside `<pid>.sock`: what `attach --list` reads of a session."""
    return os.path.splitext(socket_path)[0] + ".info"


def write_stats(socket_path: str, stats: Message) -> None:
    """Writes the stats file (a temporary file renamed over it: a reader never sees half of
    one); a failure to write is no failure of the pipeline."""
    path = stats_path(socket_path)
    tmp = path + ".tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(_dumps(stats))
        os.replace(tmp, path)
    except OSError:
        pass


def socket_dir() -> str:
    """Where sessions' sockets are: `$XDG_RUNTIME_DIR/dflash-top`, else a per-uid temp dir."""
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "dflash-top")
    return os.path.join(tempfile.gettempdir(), "dflash-top-%d" % os.getuid())


def socket_path(pid: Optional[int] = None) -> str:
    """The socket of process `pid` (this one by default)."""
    return os.path.join(socket_dir(), "%d.sock" % (pid or os.getpid()))
