"""Throughput of an unmodified script with and without `python -m dflash_top run`, side by side:
the repository's Python peer (python/peer/dflash_peer.py) on the CPU, runs taking turns
(the order reversed every round, so drift on a busy machine falls on all), tok/s as the peer
itself prints it: without `run`, with it, and with it keeping no sync call sites
(`--no-sync-sites`).

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


MODES = {"without": [], "with run": ["-m", "dflash_top", "run"],
         "run, no sites": ["-m", "dflash_top", "run", "--no-sync-sites"]}


def once(mode, script, peer_args):
    cmd = [sys.executable] + MODES[mode]
    cmd += [script] + peer_args
    env = dict(os.environ, XDG_RUNTIME_DIR=tempfile.mkdtemp(prefix="dft-"))
    env["PYTHONPATH"] = os.path.join(HERE, "..") + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--script", default=PEER,
                    help="the peer to run (python/peer/sf_peer.py: SpecForge's own train step)")
    ap.add_argument("peer", nargs="*", default=DEFAULT)
    args = ap.parse_args()
    runs = {m: [] for m in MODES}
    for i in range(args.rounds):
        for m in (list(MODES) if i % 2 == 0 else list(MODES)[::-1]):
            runs[m].append(once(m, args.script, args.peer))
            print("%-16s %8.0f tok/s" % (m, runs[m][-1]), flush=True)
    med = {m: statistics.median(v) for m, v in runs.items()}
    bare = med["without"]
    print("median: " + ", ".join(
        "%s %.0f tok/s (%.3f)" % (m, v, v / bare) for m, v in med.items()))


if __name__ == "__main__":
    main()
