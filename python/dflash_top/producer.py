"""What every producer of telemetry shares, declared (`Profiler`) or zero-code (`Auto`): serving
on this process's socket, the hello, the viewers' commands, the sample sent ten times a second,
a step's record (with the device-timed records of earlier steps in `Events` mode), the pause,
GPU timing, and closing.

A subclass supplies the stage table (`stages`), what one mark costs (`_measure`), each thread's
step in progress (`_live`) and the queues' counters (`_queue_samples`); where it has more to say
it overrides `_can_save`, `_checkpoint` and `_each_second`."""

import atexit
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from . import protocol, wire
from .cuda import CudaTiming, cuda_index, read_alloc
from .protocol import TIMING_HOST, TIMING_OF
from .serve import Server

__all__ = ["Producer"]

_mono = time.monotonic_ns

#: Device-timed records of ended steps: (host end, device ns by phase), oldest first.
DeviceSteps = List[Tuple[int, Dict[int, int]]]


class Producer:
    """The socket, the sampler and the switches the viewers flip, for a subclass that records
    threads and their steps."""

    #: Whether marks are recorded (the viewer's `p` switches it).
    on: bool
    #: The GPU timing mode of threads on a `cuda` device: `Async`, `Sync` or `Events`.
    gpu_timing: str
    #: Whether threads wait at their next step's end (the viewer's pause).
    paused: bool
    #: What one mark costs on this interpreter, ns (measured when serving).
    ns_per_mark: float
    #: The torchrun job this process is a rank of, sent in the hello; None: no job.
    job: Optional[Dict[str, Any]] = None

    def __init__(self, gpu_timing: str = "Async") -> None:
        self.on = True
        self.gpu_timing = gpu_timing
        self.paused = False
        self.ns_per_mark = 0.0
        # Bumped when profiling is switched: a step begun before the switch is not shown.
        self._epoch = 0
        self._dropped = 0
        self._cuda = CudaTiming()
        # The CUDA devices threads are on (their allocator's figures go in the samples).
        self._cuda_devices: Set[int] = set()
        self._closed = threading.Event()
        self._server: Optional[Server] = None
        self._sampler: Optional[threading.Thread] = None

    def _serve(self, path: Optional[str]) -> None:
        """Measures a mark, serves on `path` (by default this process's socket), starts the
        sampler, and closes at interpreter exit."""
        self.ns_per_mark = self._measure()
        self._server = Server(path or wire.socket_path(), self._hello, self._command)
        self._sampler = threading.Thread(
            target=self._sample_loop, name="dflash-top-sample", daemon=True
        )
        self._sampler.start()
        atexit.register(self.close)

    @property
    def path(self) -> Optional[str]:
        """The socket viewers attach to (None when not serving)."""
        return self._server.path if self._server else None

    # -- what a subclass supplies --------------------------------------------------------------

    @property
    def stages(self) -> List[Dict[str, Any]]:
        """The stage table as sent: `[{"name": ..., "phases": [...]}, ...]`."""
        raise NotImplementedError

    def _measure(self) -> float:
        """ns per mark on this interpreter, for the viewer's self-cost line."""
        raise NotImplementedError

    def _live(self, with_sites: bool) -> List[Dict[str, Any]]:
        """Each thread's step in progress, as a sample's `live`."""
        raise NotImplementedError

    def _queue_samples(self, now: int) -> List[Dict[str, int]]:
        """Each queue's counters up to `now`, as a sample's `q`."""
        raise NotImplementedError

    def _can_save(self) -> bool:
        """Whether a viewer's checkpoint command does anything."""
        return False

    def _checkpoint(self) -> None:
        """A viewer asks for a checkpoint (on a server thread)."""

    def _each_second(self, server: Server) -> None:
        """Called by the sampler once a second."""

    # -- the hello, declarations, status -------------------------------------------------------

    def _hello(self) -> Dict[str, Any]:
        hello = {
            "t": protocol.HELLO,
            "pid": os.getpid(),
            "program": "python",
            "now_ns": _mono(),
            "ns_per_mark": self.ns_per_mark,
            "stages": {"stages": self.stages},
            "can_save": self._can_save(),
            # Its host: a viewer on another host (a socket forwarded with ssh -L) knows the
            # pipeline is not on its own.
            "host": socket.gethostname(),
        }
        if self.job is not None:
            hello["job"] = self.job
        return hello

    def _declare_thread(self, tid: int, name: str, stage: str, device: str) -> None:
        """A thread registered on `device`: its allocator's figures are sampled from now on,
        and the viewers are told."""
        n = cuda_index(device)
        if n is not None:
            self._cuda_devices.add(n)
        if self._server:
            self._server.declare(
                {
                    "t": protocol.THREAD,
                    "id": tid,
                    "name": name,
                    "stage": stage,
                    "device": device,
                    "tid": threading.get_native_id(),
                }
            )

    def _declare_queue(
        self, qid: int, name: str, maxsize: int, producer: str, consumer: str
    ) -> None:
        if self._server:
            self._server.declare(
                {
                    "t": protocol.QUEUE,
                    "id": qid,
                    "name": name,
                    "capacity": maxsize if maxsize > 0 else 1 << 30,
                    "producer": producer,
                    "consumer": consumer,
                }
            )

    def status(self, text: str) -> None:
        """A line for the header of the viewers attached now."""
        if self._server:
            self._server.control({"t": protocol.STATUS, "text": text})

    # -- steps -----------------------------------------------------------------------------------

    def _step_record(
        self, r: Any, now: int, ph: List[List[int]], on: bool, next_k: int
    ) -> Tuple[Dict[str, Any], DeviceSteps]:
        """The record of thread `r`'s step ended at `now` with host phases `ph`, and, on a CUDA
        thread in `Events` mode (its host phases then not shown), the device-timed records of
        earlier steps that completed (the next step's events start in phase `next_k`)."""
        timing = TIMING_HOST
        host_phases = True
        device_steps: DeviceSteps = []
        if r.gpu:
            timing = TIMING_OF[self.gpu_timing]
            if self.gpu_timing == "Events" and on:
                host_phases = False
                device_steps = self._cuda.end_step(r, now, next_k)
        msg: Dict[str, Any] = {
            "t": protocol.STEP,
            "th": r.id,
            "end": now,
            "wall": now - r.step_start,
            "ph": ph,
            "prof": on and r.epoch == self._epoch and host_phases,
            "timing": timing,
        }
        return msg, device_steps

    def _send_step(
        self, r: Any, msg: Dict[str, Any], device_steps: DeviceSteps, other: int
    ) -> None:
        """Sends the device times of earlier steps first (as they completed; phase `other` in
        the wall only), then this step's record."""
        if not self._server:
            return
        for end, acc in device_steps:
            self._server.broadcast(
                {
                    "t": protocol.STEP,
                    "th": r.id,
                    "end": end,
                    "wall": sum(acc.values()),
                    "ph": [[k, v] for k, v in sorted(acc.items()) if v and k != other],
                    "prof": True,
                    "timing": TIMING_OF["Events"],
                    "steps": 0,
                }
            )
        self._server.broadcast(msg)

    def _wait_while_paused(self) -> None:
        while self.paused and not self._closed.is_set():
            time.sleep(0.05)

    # -- viewer commands and samples -------------------------------------------------------------

    def _command(self, c: Dict[str, Any]) -> None:
        kind, value = c.get("cmd"), c.get("value")
        if kind == protocol.SET_PROFILING:
            self.on = bool(value)
            self._epoch += 1
        elif kind == protocol.SET_GPU_TIMING and value in TIMING_OF:
            self.gpu_timing = value
        elif kind == protocol.SET_PAUSED:
            self.paused = bool(value)
        elif kind == protocol.CHECKPOINT:
            self._checkpoint()

    def _sample(self, with_sites: bool = True) -> Dict[str, Any]:
        """The sample; `with_sites`: with each thread's host syncs by call site where it keeps
        them (cumulative: sent once a second)."""
        now = _mono()
        live = self._live(with_sites)
        msg: Dict[str, Any] = {
            "t": protocol.SAMPLE,
            "now": now,
            "prof": self.on,
            "timing": self.gpu_timing,
            "paused": self.paused,
            "dropped": self._dropped,
            "live": live,
            "q": self._queue_samples(now),
        }
        alloc = read_alloc(tuple(self._cuda_devices))
        if alloc:
            msg["alloc"] = alloc
        return msg

    def _sample_loop(self) -> None:
        """Ten samples a second to the viewers attached (none encoded without one), and
        `_each_second` once a second."""
        tick = 0.1
        nxt = time.monotonic() + tick
        n = 0
        while not self._closed.wait(max(0.0, nxt - time.monotonic())):
            nxt += tick
            n += 1
            server = self._server
            if server is None:
                continue
            if server.viewers():
                server.broadcast(self._sample(with_sites=n % 10 == 0))
            if n % 10 == 0:
                self._each_second(server)

    def close(self) -> None:
        """Stops serving and removes the socket (also done at interpreter exit)."""
        self._closed.set()
        if self._sampler is not None:
            self._sampler.join(timeout=1)
        if self._server:
            self._server.close()
            self._server = None
