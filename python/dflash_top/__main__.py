"""`python -m dflash_top run script.py [args]`: runs an unmodified script with zero-code
telemetry (dflash_top.auto), served for `dflash-top attach`.

`python -m dflash_top run -m module [args]` runs a module the same way."""

import os
import runpy
import sys
import traceback
from typing import List, Optional

USAGE = (
    "usage: python -m dflash_top run [--gpu-timing async|sync|events] [--no-sync-sites]"
    " script.py [args] | python -m dflash_top run [OPTIONS] -m module [args]"
)
TIMINGS = {"async": "Async", "sync": "Sync", "events": "Events"}


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    timing = "Async"
    sync_sites = True
    # The options of `run`, before the script (the script's own come after it).
    while len(args) >= 2 and args[0] == "run" and args[1].startswith("--"):
        flag = args.pop(1)
        if flag.startswith("--gpu-timing"):
            value = flag.split("=", 1)[1] if "=" in flag else (args.pop(1) if len(args) > 1 else "")
            if value not in TIMINGS:
                print("--gpu-timing %r: use async, sync or events" % value, file=sys.stderr)
                return 2
            timing = TIMINGS[value]
        elif flag == "--no-sync-sites":
            sync_sites = False
        else:
            print("%s: not an option of run; %s" % (flag, USAGE[len("usage: "):]), file=sys.stderr)
            return 2
    if len(args) < 2 or args[0] != "run" or (args[1] == "-m" and len(args) < 3):
        print(USAGE, file=sys.stderr)
        return 2
    if args[1] != "-m" and not os.path.isfile(args[1]):
        # As `python missing.py` says it, with its status, before anything is served.
        print(
            "%s: can't open file %r: [Errno 2] No such file or directory"
            % (sys.executable, os.path.abspath(args[1])),
            file=sys.stderr,
        )
        return 2
    from .auto import auto

    a = auto(gpu_timing=timing, sync_sites=sync_sites)
    if os.environ.get("DFLASH_TOP_QUIET") != "1":
        print(
            "dflash-top: serving on %s: dflash-top attach %d"
            % (a._server.path if a._server else "-", os.getpid()),
            file=sys.stderr,
            flush=True,
        )
    try:
        if args[1] == "-m":
            sys.argv = args[2:]
            runpy.run_module(args[2], run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(args[1])
            sys.argv = args[1:]
            # As `python script.py` does: the script's directory first on the path, its
            # frames named by its absolute path.
            sys.path.insert(0, os.path.dirname(script))
            runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001 - shown as the script's own, status 1
        _print_script_traceback(e)
        return 1
    return 0


def _print_script_traceback(e: BaseException) -> None:
    """The traceback `python script.py` prints: from the script's first frame on (this
    module's and runpy's frames left out)."""
    tb = e.__traceback__
    ours = (os.path.abspath(__file__), os.path.abspath(runpy.__file__))
    while tb is not None and (
        os.path.abspath(tb.tb_frame.f_code.co_filename) in ours
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb)


if __name__ == "__main__":
    sys.exit(main())
