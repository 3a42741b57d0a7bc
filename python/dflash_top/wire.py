"""The dflash-top wire protocol (docs/protocol.md): a 12-byte preamble each way, then frames of
a 4-byte little-endian length and one JSON message. Standard library only."""

import json
import os
import struct
import tempfile

MAGIC = b"DFLSHTOP"
VERSION = 1
MAX_FRAME = 1 << 20


class WireError(Exception):
    pass


def preamble(version=VERSION):
    return MAGIC + struct.pack("<I", version)


def check_preamble(b):
    """Raises WireError with a sentence when `b` is not our preamble of our version."""
    if len(b) != 12 or b[:8] != MAGIC:
        raise WireError("the other side does not speak the dflash-top protocol")
    (theirs,) = struct.unpack("<I", b[8:])
    if theirs != VERSION:
        raise WireError(
            "protocol version mismatch: this dflash_top speaks version %d, the other side "
            "version %d; use the same dflash-top release on both sides" % (VERSION, theirs)
        )


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def frame(msg):
    body = _dumps(msg).encode()
    return struct.pack("<I", len(body)) + body


def read_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def read_frame(sock):
    """The next message, or None when the peer closed the connection."""
    head = read_exact(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack("<I", head)
    if n > MAX_FRAME:
        raise WireError("a frame of %d bytes exceeds the limit of %d" % (n, MAX_FRAME))
    body = read_exact(sock, n)
    if body is None:
        return None
    return json.loads(body)


def socket_dir():
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run:
        return os.path.join(run, "dflash-top")
    return os.path.join(tempfile.gettempdir(), "dflash-top-%d" % os.getuid())


def socket_path(pid=None):
    return os.path.join(socket_dir(), "%d.sock" % (pid or os.getpid()))
