"""What a phase mark costs in CPython (timeit), profiling on and off.

    pip install ./python && python python/examples/mark_cost.py
"""

import os
import sys
import threading
import timeit

try:
    from dflash_top import Profiler
except ImportError:  # not installed: the package in this source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from dflash_top import Profiler


def main():
    prof = Profiler([("worker", ["a", "b"])], serve=False)
    out = {}

    def run():
        prof.thread("worker")
        n = 200_000
        for on in (True, False):
            prof.on = on
            t = min(timeit.repeat("mark('a'); mark('b')", globals={"mark": prof.mark}, number=n // 2, repeat=5))
            out["mark, profiling %s" % ("on" if on else "off")] = t / n * 1e9
        prof.on = True
        ctx = prof.phase("a")
        t = min(timeit.repeat("with ctx: pass", globals={"ctx": ctx}, number=n, repeat=5))
        out["with phase (two marks)"] = t / n * 1e9

    t = threading.Thread(target=run, name="worker")
    t.start()
    t.join()
    print("python %s" % sys.version.split()[0])
    for k, v in out.items():
        print("%-24s %6.0f ns" % (k, v))


if __name__ == "__main__":
    main()
