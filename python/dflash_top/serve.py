"""Serves a Profiler's stream on the dflash-top socket: one writer and one reader thread per
viewer; a viewer that reads too slowly loses data frames (counted and told), never the
pipeline's time."""

import os
import queue
import socket
import struct
import threading
from typing import Any, Callable, Dict, List

from . import protocol, wire
from .wire import Message

VIEWER_BACKLOG = 1024


class _Outlet:
    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.ctl: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self.data: queue.Queue[bytes] = queue.Queue(maxsize=VIEWER_BACKLOG)
        # Not a queue of the pipeline (zero-code mode's queue wraps leave it alone).
        self.data.__dict__["_dft_skip"] = True
        self.dropped = 0
        self.closed = False

    def send_data(self, f: bytes) -> None:
        try:
            self.data.put_nowait(f)
        except queue.Full:
            self.dropped += 1

    def pump(self) -> None:
        told = 0
        try:
            while not self.closed:
                try:
                    f = self.ctl.get_nowait()
                except queue.Empty:
                    try:
                        f = self.data.get(timeout=0.1)
                    except queue.Empty:
                        f = None
                if f is not None:
                    self.conn.sendall(f)
                if self.dropped != told:
                    told = self.dropped
                    self.conn.sendall(wire.frame({"t": protocol.DROPPED, "frames": told}))
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        self.closed = True
        try:
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Server:
    """Listens on `path` (0600) and fans frames out to every viewer."""

    def __init__(
        self,
        path: str,
        hello: Callable[[], Message],
        on_command: Callable[[Dict[str, Any]], None],
    ) -> None:
        self.path = path
        self._hello = hello
        self._on_command = on_command
        self._decls: List[bytes] = []
        self._outlets: List[_Outlet] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        d = os.path.dirname(path)
        os.makedirs(d, mode=0o700, exist_ok=True)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        os.chmod(path, 0o600)
        self._sock.listen(8)
        self._sock.settimeout(0.1)
        self._threads: List[threading.Thread] = []
        t = threading.Thread(target=self._accept, name="dflash-top-serve", daemon=True)
        t.start()
        self._accept_thread = t

    def declare(self, msg: Message) -> None:
        """A declaration: sent to every viewer now and to each one that attaches later."""
        f = wire.frame(msg)
        with self._lock:
            self._decls.append(f)
            for o in self._outlets:
                o.ctl.put(f)

    def control(self, msg: Message) -> None:
        """A frame never dropped (a status line), for the viewers attached now."""
        f = wire.frame(msg)
        with self._lock:
            for o in self._outlets:
                o.ctl.put(f)

    def viewers(self) -> int:
        with self._lock:
            self._outlets = [o for o in self._outlets if not o.closed]
            return len(self._outlets)

    def broadcast(self, msg: Message) -> None:
        """Encodes once, for every viewer; nothing is encoded when none is attached."""
        if not self._outlets:
            return
        f = wire.frame(msg)
        with self._lock:
            for o in self._outlets:
                o.send_data(f)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._welcome(conn)

    def _welcome(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        try:
            conn.sendall(wire.preamble())
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", cred)
            if uid != os.getuid():
                reason = (
                    "refused: this session belongs to uid %d and the viewer runs as uid %d; "
                    "attach as the user who started it" % (os.getuid(), uid)
                )
                conn.sendall(wire.frame({"t": protocol.REFUSED, "reason": reason}))
                conn.close()
                return
            theirs = wire.read_exact(conn, protocol.PREAMBLE_LEN)
            wire.check_preamble(theirs or b"")
        except (OSError, wire.WireError) as e:
            try:
                conn.sendall(wire.frame({"t": protocol.REFUSED, "reason": "refused: %s" % e}))
                conn.close()
            except OSError:
                pass
            return
        conn.settimeout(None)
        o = _Outlet(conn)
        with self._lock:
            o.ctl.put(wire.frame(self._hello()))
            for d in self._decls:
                o.ctl.put(d)
            self._outlets.append(o)
        w = threading.Thread(target=o.pump, name="dflash-top-out", daemon=True)
        r = threading.Thread(target=self._read, args=(o,), name="dflash-top-in", daemon=True)
        w.start()
        r.start()
        self._threads += [w, r]

    def _read(self, o: _Outlet) -> None:
        try:
            while True:
                m = wire.read_frame(o.conn)
                if m is None:
                    break
                if m.get("t") == protocol.COMMAND:
                    self._on_command(m.get("cmd") or {})
        except (OSError, ValueError, wire.WireError):
            pass
        o.close()

    def close(self) -> None:
        self._stop.set()
        try:
            self._sock.close()
        except OSError:
            pass
        self._accept_thread.join(timeout=1)
        with self._lock:
            outlets, self._outlets = self._outlets, []
        for o in outlets:
            o.close()
        for t in self._threads:
            t.join(timeout=1)
        for path in (self.path, wire.stats_path(self.path)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
