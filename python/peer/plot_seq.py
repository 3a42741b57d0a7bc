"""Tokens per second and peak GPU memory against the row's length, dflash-top and the Python
peers, from the JSON files python/peer/compare.py writes (`--configs preset:batch:seq --json F`),
one preset and batch a plot, as one PNG of two panels.

    .venv/bin/python python/peer/plot_seq.py OUT.png run1.json [run2.json ...]

A stack that failed at a length (out of memory, say) is drawn as a cross on the axis at that
length, its error in the legend's label.
"""

import json
import sys

STACKS = [("ours", "dflash-top", "tab:blue"), ("specforge", "SpecForge 0.2.0", "tab:orange"),
          ("python", "transformers + dflash", "tab:green")]


def read_rows(paths):
    """The rows of every file, one per (preset, batch, seq); a later file's row replaces an
    earlier one's."""
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                rows[(r["preset"], r["batch"], r.get("seq", 3072))] = r
    return [rows[k] for k in sorted(rows)]


def series(rows, stack, key):
    """(seq, value) where the stack ran, and the seqs where it failed."""
    ran, failed = [], []
    for r in rows:
        x = r.get(stack)
        if x is None:
            continue
        if key in x:
            ran.append((r.get("seq", 3072), x[key]))
        elif "error" in x:
            failed.append(r.get("seq", 3072))
    return ran, failed


def main():
    if len(sys.argv) < 3:
        raise SystemExit("usage: plot_seq.py OUT.png COMPARE.json [COMPARE.json ...]")
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_seq.py needs matplotlib: make reference installs it in .venv")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_rows(sys.argv[2:])
    if not rows:
        raise SystemExit(f"{', '.join(sys.argv[2:])}: no rows: run compare.py with --json")
    shapes = sorted({(r["preset"], r["batch"]) for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for (preset, batch) in shapes:
        mine = [r for r in rows if (r["preset"], r["batch"]) == (preset, batch)]
        for stack, name, color in STACKS:
            for ax, key in zip(axes, ["tok_per_s", "peak_allocated_gib"]):
                ran, failed = series(mine, stack, key)
                if not ran and not failed:
                    continue
                label = f"{name}, {preset} batch {batch}"
                if ran:
                    ax.plot(*zip(*ran), marker="o", color=color, label=label)
                if failed:
                    ax.plot(failed, [0] * len(failed), "x", color=color, markersize=10,
                            label=f"{label}: failed")
    for ax, unit in zip(axes, ["target tokens per second", "peak GPU memory allocated (GiB)"]):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens a row")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    print(sys.argv[1])


if __name__ == "__main__":
    main()
