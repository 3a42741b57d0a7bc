"""Shared by the client's tests: the source tree's package first on sys.path (the tests check
this tree; test_install.py checks what `pip install ./python` makes of it), a viewer that
attaches to a Profiler's socket, and a Profiler whose sends are captured instead of served."""

import os
import shutil
import socket
import sys
import tempfile
import threading
import time

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)

from dflash_top import Profiler, wire  # noqa: E402


class Captured:
    """Stands in for the socket server: keeps what the profiler would send."""

    def __init__(self):
        self.path = None
        self.declared = []
        self.sent = []
        self.controls = []

    def declare(self, msg):
        wire.frame(msg)  # what is sent must encode
        self.declared.append(msg)

    def broadcast(self, msg):
        wire.frame(msg)
        self.sent.append(msg)

    def control(self, msg):
        self.controls.append(msg)

    def viewers(self):
        return 1

    def close(self):
        pass

    def steps(self):
        return [m for m in self.sent if m["t"] == "step"]


@pytest.fixture
def captured():
    """A Profiler factory: (Profiler, Captured) with sends captured and no socket."""
    made = []

    def make(stages):
        p = Profiler(stages, serve=False)
        c = Captured()
        p._server = c
        made.append(p)
        return p, c

    yield make
    for p in made:
        p._closed.set()


def in_thread(fn, name="worker"):
    """Runs `fn` in a new thread (a profiler's records are per thread) and returns its result."""
    out = []
    err = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            err.append(e)

    t = threading.Thread(target=run, name=name)
    t.start()
    t.join(timeout=30)
    if err:
        raise err[0]
    return out[0] if out else None


class Viewer:
    """A minimal viewer: the preamble exchange, then every frame read in a thread."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(path)
        self.theirs = wire.read_exact(self.sock, 12)
        self.sock.sendall(wire.preamble())
        self.frames = []
        self.raw = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        try:
            while True:
                head = wire.read_exact(self.sock, 4)
                if head is None:
                    return
                body = wire.read_exact(self.sock, int.from_bytes(head, "little"))
                if body is None:
                    return
                self.raw.append(head + body)
                self.frames.append(wire.unframe(head + body)[0])
        except OSError:
            return

    def wait_for(self, pred, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            hits = [f for f in list(self.frames) if pred(f)]
            if hits:
                return hits
            time.sleep(0.02)
        raise AssertionError("no such frame in %d read" % len(self.frames))

    def send(self, msg):
        self.sock.sendall(wire.frame(msg))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


@pytest.fixture
def short_dir():
    """A directory with a short path (a Unix socket's path has at most 107 bytes)."""
    d = tempfile.mkdtemp(prefix="dft-")
    yield d
    shutil.rmtree(d, ignore_errors=True)
