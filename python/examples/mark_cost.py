"""What a phase mark costs in CPython (timeit), profiling on and off; and what zero-code mode
adds to the calls it wraps (the extra ns per call, with and without it).

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
    zero_code(out)
    print("python %s" % sys.version.split()[0])
    for k, v in out.items():
        print("%-40s %6.0f ns" % (k, v))


def zero_code(out):
    """What zero-code mode (`python -m dflash_top run`) adds to the calls it wraps: the extra ns
    per call, measured in the same thread with and without it. A module call is a top-level
    Sequential of 16 Linear(4, 4), in a thread whose steps end at an optimizer step; before
    the top-level modules settle every module call takes the global hooks, after it only the
    top-level one."""
    try:
        import torch
    except ImportError:
        return
    from dflash_top.auto import SYNC, Auto, _Rec

    torch.set_num_threads(1)
    n = 5_000

    def per_call(stmt, g):
        return min(timeit.repeat(stmt, globals=g, number=n, repeat=5)) / n * 1e9

    x = torch.ones(())
    seq = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(16)])
    inp = torch.ones(1, 4)
    opt = torch.optim.SGD(seq.parameters(), lr=0.0)
    calls = {
        ".item()": ("x.item()", {"x": x}),
        "module call (17 modules)": ("seq(inp)", {"seq": seq, "inp": inp}),
        "queue.Queue put + get": ("q.put(1); q.get()", {"q": __import__("queue").Queue()}),
    }

    def measure(into, names):
        opt.step()  # this thread's steps end at the optimizer's step, as a trainer's do
        for name in names:
            stmt, g = calls[name]
            into[name] = per_call(stmt, g)

    def in_thread(into, names):
        t = threading.Thread(target=measure, args=(into, names), name="worker")
        t.start()
        t.join()

    base, before, after = {}, {}, {}
    in_thread(base, list(calls))
    a = Auto(serve=False)
    r = _Rec(0, "m", "m", 0, 0, False)
    k = a._phase_idx[SYNC]
    out["auto: phase enter + leave"] = per_call(
        "e(r, k); l(r)", {"e": a.enter, "l": a.leave, "r": r, "k": k}
    )
    a.install()
    in_thread(before, list(calls))
    no_sites = {}
    a.sites = False
    in_thread(no_sites, [".item()"])
    a.sites = True
    a._settle()
    in_thread(after, ["module call (17 modules)"])
    a.close()
    for name in calls:
        out["auto: %s, %.0f ns bare" % (name, base[name])] = before[name] - base[name]
    out["auto: .item(), sync sites off (--no-sync-sites)"] = no_sites[".item()"] - base[".item()"]
    name = "module call (17 modules)"
    out["auto: %s, settled" % name] = after[name] - base[name]


if __name__ == "__main__":
    main()
