"""The wire encoding: the documented layout (docs/protocol.md, Framing), and what it encodes
decodes back."""

import json
import math
import os
import socket
import struct

import pytest

from dflash_top import protocol, wire


def test_preamble_is_magic_then_version_le_u32():
    p = wire.preamble()
    assert p == b"DFLSHTOP" + bytes([protocol.VERSION, 0, 0, 0])
    assert len(p) == protocol.PREAMBLE_LEN
    wire.check_preamble(p)


def test_other_version_or_no_magic_is_refused_with_a_sentence():
    with pytest.raises(wire.WireError) as e:
        wire.check_preamble(wire.preamble(9))
    assert "version %d" % protocol.VERSION in str(e.value) and "version 9" in str(e.value)
    for bad in (b"GET / HTTP/1.1\r\n"[:12], b"", b"DFLSHTOP"):
        with pytest.raises(wire.WireError, match="does not speak"):
            wire.check_preamble(bad)


def test_frame_is_le_u32_length_then_compact_json():
    msg = {"t": "status", "text": "héllo"}
    f = wire.frame(msg)
    (n,) = struct.unpack("<I", f[:4])
    assert n == len(f) - 4
    assert f[4:] == json.dumps(msg, separators=(",", ":")).encode()


def test_frames_round_trip():
    msgs = [
        {"t": "status", "text": "hi"},
        {"t": "command", "cmd": {"cmd": "set_profiling", "value": False}},
        {"t": "step", "th": 2, "end": 10, "wall": 5, "ph": [[0, 3]], "prof": True, "tok": 7},
        {"t": "sample", "now": 1 << 62, "live": [], "q": [], "timing": "Events"},
    ]
    buf = b"".join(wire.frame(m) for m in msgs)
    got = []
    while buf:
        m, used = wire.unframe(buf)
        assert used > 0
        got.append(m)
        buf = buf[used:]
    assert got == msgs
    # Over a socket, as the server and a viewer read them.
    a, b = socket.socketpair()
    try:
        a.sendall(wire.preamble() + b"".join(wire.frame(m) for m in msgs))
        a.close()
        wire.check_preamble(wire.read_exact(b, protocol.PREAMBLE_LEN))
        assert [wire.read_frame(b) for _ in msgs] == msgs
        assert wire.read_frame(b) is None  # a clean end
    finally:
        b.close()


def test_partial_and_oversized_frames():
    f = wire.frame({"t": "dropped", "frames": 3})
    assert wire.unframe(f[:2]) == (None, 0)
    assert wire.unframe(f[:-1]) == (None, 0)
    huge = struct.pack("<I", protocol.MAX_FRAME + 1)
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.unframe(huge)
    a, b = socket.socketpair()
    try:
        a.sendall(huge)
        with pytest.raises(wire.WireError):
            wire.read_frame(b)
    finally:
        a.close()
        b.close()


def test_non_finite_numbers_never_make_invalid_json():
    # JSON has no NaN: the viewer would reject the frame, so encoding refuses instead.
    for v in (math.nan, math.inf):
        with pytest.raises(ValueError):
            wire.frame({"t": "step", "m": {"loss": v}})


def test_socket_path_follows_xdg_runtime_dir(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/5")
    assert wire.socket_path(42) == "/run/user/5/dflash-top/42.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert wire.socket_path(42).endswith("dflash-top-%d/42.sock" % os.getuid())
