"""Learning curves of python/peer/quality.py (run with --curve K --json OUT): acceptance length
in dflash against target tokens read and against seconds of training after the first optimizer
step, one line per trainer and seed, as two PNG files.

    .venv/bin/python python/peer/plot_curves.py OUT.json PREFIX   # PREFIX-tokens.png, -seconds.png
"""

import json
import sys


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: plot_curves.py QUALITY.json PREFIX")
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plot_curves.py needs matplotlib: make reference installs it in .venv")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(sys.argv[1]) as f:
        table = json.load(f)
    curves = table.get("curves") or []
    if not curves:
        raise SystemExit(f"{sys.argv[1]} has no learning curves: run quality.py with --curve 8")
    colors = {"dflash-top": "tab:blue", "specforge": "tab:orange"}
    for axis, key, unit in [("tokens", "target_tokens", "target tokens read"),
                            ("seconds", "seconds", "seconds after the first step")]:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        seen = set()
        for c in curves:
            name = f"{c['trainer']} ({c['label']})"
            ax.plot([p[key] for p in c["points"]], [p["acceptance"] for p in c["points"]],
                    marker="o", color=colors.get(c["trainer"], "gray"), alpha=0.8,
                    label=None if name in seen else name)  # fmt: skip
            seen.add(name)
        ax.set_xlabel(unit)
        ax.set_ylabel("acceptance length in dflash")
        # The curves' own seeds (quality.py's --curve-seeds may take fewer than the table's).
        seeds = sorted({c["seed"] for c in curves if "seed" in c}) or table["seeds"]
        ax.set_title(f"{table['size']} size, {table['eval_prompts']} held-out prompts, "
                     f"curve seeds {seeds}")  # fmt: skip
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        out = f"{sys.argv[2]}-{axis}.png"
        fig.savefig(out, dpi=120)
        print(out)


if __name__ == "__main__":
    main()
