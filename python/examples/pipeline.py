"""A two-stage PyTorch pipeline (CPU is fine) instrumented with dflash_top: a producer makes
batches, a queue holds them, a consumer trains a small model on them. Runs until stopped
(Ctrl-C, SIGTERM) or for --seconds. Watch it with `dflash-top attach`.

    pip install ./python && python python/examples/pipeline.py [--slow producer=300ms]

(Without the install it uses the package in the source tree next to it.)

Without torch the stages do plain Python work of the same shape.
"""

import argparse
import os
import queue
import signal
import sys
import threading
import time

try:
    from dflash_top import Profiler
except ImportError:  # not installed: the package in this source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from dflash_top import Profiler

try:
    import torch
except ImportError:
    torch = None


def duration(text):
    """`300ms`, `1.5s` or `2` (seconds)."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text)


def parse_slow(items):
    slow = {"producer": 0.0, "consumer": 0.0}
    for item in items:
        stage, sep, d = item.partition("=")
        if not sep or stage not in slow:
            sys.exit("--slow %s: give STAGE=DURATION with STAGE producer or consumer" % item)
        try:
            slow[stage] = duration(d)
        except ValueError:
            sys.exit("--slow %s: %r is not a duration such as 300ms or 1.5s" % (item, d))
    return slow


def busy(seconds):
    """Plain Python work for about `seconds` (what runs when torch is absent)."""
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slow", action="append", default=[], metavar="STAGE=DURATION")
    ap.add_argument("--queue", type=int, default=8, help="queue capacity")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this long")
    ap.add_argument("--no-torch", action="store_true", help="plain Python work even with torch")
    args = ap.parse_args()
    slow = parse_slow(args.slow)
    use_torch = torch is not None and not args.no_torch
    if use_torch:
        torch.set_num_threads(1)

    prof = Profiler([("producer", ["make"]), ("consumer", ["forward", "backward", "optim"])])
    batches = prof.queue(queue.Queue(maxsize=args.queue), "batches")
    stop = threading.Event()

    def producer():
        prof.thread("producer")
        while not stop.is_set():
            with prof.phase("make"):
                if use_torch:
                    batch = (torch.randn(64, 256), torch.randn(64, 1))
                else:
                    busy(0.002)
                    batch = None
                if slow["producer"]:
                    time.sleep(slow["producer"])
            try:
                batches.put(batch, timeout=0.2)
            except queue.Full:
                continue
            prof.end_step()

    def consumer():
        prof.thread("consumer")
        if use_torch:
            model = torch.nn.Sequential(
                torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
            )
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        while not stop.is_set():
            try:
                batch = batches.get(timeout=0.2)
            except queue.Empty:
                continue
            prof.mark("forward")
            if use_torch:
                x, y = batch
                for _ in range(8):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                prof.mark("backward")
                loss.backward()
                prof.mark("optim")
                opt.step()
                opt.zero_grad()
                loss = loss.item()
            else:
                busy(0.008)
                prof.mark("backward")
                busy(0.008)
                prof.mark("optim")
                busy(0.002)
                loss = 1.0
            if slow["consumer"]:
                time.sleep(slow["consumer"])
            prof.end_step(tokens=64, loss=loss)

    def on_signal(*_):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [
        threading.Thread(target=producer, name="producer"),
        threading.Thread(target=consumer, name="consumer"),
    ]
    for w in workers:
        w.start()
    print("serving on %s: dflash-top attach %d" % (prof.path, os.getpid()), flush=True)
    deadline = None if args.seconds is None else time.monotonic() + args.seconds
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        stop.wait(0.1)
    stop.set()
    for w in workers:
        w.join()
    prof.close()


if __name__ == "__main__":
    main()
