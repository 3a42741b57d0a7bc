"""`python -m dflash_top run script.py [args]`: runs an unmodified script with zero-code
telemetry (dflash_top.auto), served for `dflash-top attach`.

`python -m dflash_top run -m module [args]` runs a module the same way."""

import os
import runpy
import sys
from typing import List, Optional

USAGE = (
    "usage: python -m dflash_top run [--gpu-timing async|sync|events] script.py [args]"
    " | python -m dflash_top run [--gpu-timing MODE] -m module [args]"
)
TIMINGS = {"async": "Async", "sync": "Sync", "events": "Events"}


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    timing = "Async"
    if len(args) >= 2 and args[0] == "run" and args[1].startswith("--gpu-timing"):
        flag = args.pop(1)
        value = flag.split("=", 1)[1] if "=" in flag else (args.pop(1) if len(args) > 1 else "")
        if value not in TIMINGS:
            print("--gpu-timing %r: use async, sync or events" % value, file=sys.stderr)
            return 2
        timing = TIMINGS[value]
    if len(args) < 2 or args[0] != "run" or (args[1] == "-m" and len(args) < 3):
        print(USAGE, file=sys.stderr)
        return 2
    from .auto import auto

    a = auto(gpu_timing=timing)
    if os.environ.get("DFLASH_TOP_QUIET") != "1":
        print(
            "dflash-top: serving on %s: dflash-top attach %d" % (a._server.path if a._server else "-", os.getpid()),
            file=sys.stderr,
            flush=True,
        )
    if args[1] == "-m":
        sys.argv = args[2:]
        runpy.run_module(args[2], run_name="__main__", alter_sys=True)
    else:
        script = args[1]
        sys.argv = args[1:]
        # As `python script.py` does: the script's directory first on the path.
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
