"""Throughput of an unmodified script with and without `python -m dflash_top run`, side by side:
the repository's Python peer (python/peer/dflash_peer.py) on the CPU, runs taking turns
(ABBA, so drift on a busy machine falls on both), tok/s as the peer itself prints it.

    python python/examples/run_overhead.py [--rounds 3] [-- peer args]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "..", "peer", "dflash_peer.py")
DEFAULT = [
    "--preset", "tiny", "--device", "cpu", "--steps", "60", "--warmup", "3",
    "--seq", "128", "--batch", "1", "--anchors", "8",
]


def once(zero_code, peer_args):
    cmd = [sys.executable]
    if zero_code:
        cmd += ["-m", "dflash_top", "run"]
    cmd += [PEER] + peer_args
    env = dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp(prefix="dft-"))
    env["PYTHONPATH"] = os.path.join(HERE, "..") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("peer", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    runs = {False: [], True: []}
    for i in range(args.rounds):
        for z in ([False, True] if i % 2 == 0 else [True, False]):
            runs[z].append(once(z, args.peer))
            print("%-16s %8.0f tok/s" % ("with run" if z else "without", runs[z][-1]), flush=True)
    bare, auto = statistics.median(runs[False]), statistics.median(runs[True])
    print("median: without %.0f tok/s, with run %.0f tok/s, ratio %.3f" % (bare, auto, auto / bare))


if __name__ == "__main__":
    main()
