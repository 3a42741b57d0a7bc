"""dflash-top against the Python stacks, side by side in one call on one GPU.

For each config (preset, batch) it runs `dflash-top bench engine` (1 target + 1 drafter worker
sharing the GPU), then dflash_peer.py (the stack a team writes: a target thread + queue + z-lab's
drafter in the main thread) and sf_peer.py (SpecForge 0.2.0's drafter, loss, BF16Optimizer and
train step, flex attention) with the same shapes and anchors, each in a fresh process, and prints
a markdown table: tokens per second, the ratios, MFU (model FLOPs per second, `step_flops` averaged
over rows of the synthetic documents all three train on, over the bf16 matmul peak measured at the
start of the same call) and the peak GPU memory each allocated.

  python3 python/peer/compare.py --bin .gpu/dflash-top [--configs qwen3-0.6b:1,qwen3-8b:1:8192]
      [--fit qwen3-0.6b --fit-ours 16,24,32 --fit-python 2,3,4,5]

A config is `preset:batch` or `preset:batch:seq` (tokens a row; 3072 when left out), each row
with 512 anchors (SpecForge's default, whatever the length).

`--fit` also finds the largest batch each stack runs at one preset (the first of the listed
batches that fails ends the search).
"""

import argparse
import itertools
import json
import os
import random
import re
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from dflash_peer import PRESETS, synthetic_row  # noqa: E402
from dflash.model import build_target_layer_ids  # noqa: E402


def matmul_peak_tflops(device, n=8192, iters=40):
    """The bf16 matmul rate this GPU gives now (TFLOP/s), the MFU denominator."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * n**3 * iters / (time.perf_counter() - t) / 1e12


def step_flops(shape, batch, seq=3072, anchors=512, block=16, drafter_layers=5, docs=None):
    """FLOPs of one training step over `batch` rows as the step computes them, counted term for
    term as src/engine/model/flops.rs counts them (python/tests/test_peer_flops.py and that file's tests
    hold one hand count): a multiply-add is 2 FLOPs, attention counts the (query, key) pairs a
    query sees.
    - target: its layers up to the deepest one the drafter reads, attention causal within each
      document;
    - drafter forward: fc over the row's tokens, then per layer the block tokens' projections
      and MLP, the context tokens' keys and values, and attention over the context before the
      anchor (its mean over anchors spread on every position but a document's last) and the
      block; backward: twice the layers, fc's weight gradient only (its input is frozen);
    - loss: the frozen lm head's forward and input gradient over the labelled slots, anchors x
      (block - 1) (slot 0 has no label).
    `shape`: a PRESETS entry; `docs`: a row's document lengths, summing to `seq` (None: the row
    as one document, an upper bound)."""
    h, inter, n_layers, heads, kv, d, vocab, _ = shape
    ids = build_target_layer_ids(n_layers, drafter_layers)
    docs = docs or [seq]
    assert sum(docs) == seq, "documents fill the row"
    macs = h * (2 * heads * d + 2 * kv * d) + 3 * h * inter  # a token through a layer's weights
    pairs = sum(n * (n + 1) / 2 for n in docs)
    target = min(max(ids) + 1, n_layers) * (2 * seq * macs + 4 * pairs * heads * d)
    q = anchors * block
    places = sum(max(n - 1, 0) for n in docs)
    ctx = sum(max(n - 1, 0) * max(n - 2, 0) / 2 for n in docs) / places if places else 0.0
    layer = 2 * q * macs + 2 * seq * 2 * h * kv * d + 4 * q * (ctx + block) * heads * d
    layers = drafter_layers * layer
    fc = 2 * seq * len(ids) * h * h
    drafter = (layers + fc) + (2 * layers + fc)
    loss = 2 * 2 * anchors * max(block - 1, 0) * h * vocab
    return batch * (target + drafter + loss)


def synthetic_docs(seq, rows=64, seed=0):
    """The document lengths of `rows` rows of the synthetic data every stack here trains on
    (dflash_peer.py's `synthetic_row`, which draws them as dflash-top's loader does)."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        _, docs, _, _ = synthetic_row(rng, seq, 16, list(range(16)))
        out.append([len(list(run)) for _, run in itertools.groupby(docs)])
    return out


def run(cmd, timeout):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout


def largest_batch(preset, batches, attempt):
    """The largest of `batches` (ascending) whose run succeeds; stops at the first failure."""
    best = None
    for b in batches:
        try:
            attempt(preset, b)
        except Exception as e:
            print(f"{preset} batch {b}: failed ({str(e).strip().splitlines()[-1][:120]})", flush=True)
            break
        print(f"{preset} batch {b}: fits", flush=True)
        best = b
    return best


# dflash-top steps per preset at batch 1: about 15 s on an H200, so that the "last 10 s" rate
# bench engine reports starts after the first steps (graph capture, cuBLAS and allocator warm-up),
# as the peer's rate starts after its warm-up steps. Fewer steps at a larger batch.
STEADY_STEPS = {"qwen3-0.6b": 200, "qwen3-8b": 64}


def ours_steps(preset, batch, steps, seq=3072):
    """About 15 s of steps at 3072 tokens a row; on longer rows twice the tokens, at least 24
    steps (at 8B, 12 steps of 16K and 24 of 8K lasted about 10 s, so their last 10 s held the
    warm-up)."""
    if steps:
        return steps
    if seq == 3072:
        return max(40, STEADY_STEPS.get(preset, 40) // batch)
    return max(24, 2 * STEADY_STEPS.get(preset, 40) * 3072 // (seq * batch))


def peer_steps(steps, seq):
    """The Python peers' timed steps: `steps` at 3072 tokens a row, fewer (at least 4) on longer
    rows, where each step takes longer."""
    return max(4, steps * 3072 // max(seq, 3072))


def ours(binary, preset, batch, steps, device, seq=3072, extra=()):
    out = run(
        [binary, "bench", "engine", "--preset", preset, "--batch", str(batch),
         "--seq-len", str(seq), "--target-devices", device, "--drafter-devices", device,
         "--steps", str(steps), *extra],
        timeout=600,
    )
    tok = float(re.search(r"tok/s=([0-9.]+) \(last 10 s\)", out).group(1))
    mean = float(re.search(r"mean_tok/s=([0-9.]+)", out).group(1))
    mem = re.search(r"peak_allocated_gib=([0-9.]+)", out)
    return {"tok_per_s": tok, "mean_tok_per_s": mean,
            "peak_allocated_gib": float(mem.group(1)) if mem else float("nan"), "log": out}


def python(preset, batch, steps, device, warmup=5, seq=3072):
    out = run(
        [sys.executable, os.path.join(HERE, "dflash_peer.py"), "--preset", preset,
         "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
         "--seq", str(seq), "--device", device],
        timeout=600,
    )
    return json.loads(out.strip().splitlines()[-1])


def specforge(preset, batch, steps, device, warmup=5, seq=3072):
    out = run(
        [sys.executable, os.path.join(HERE, "sf_peer.py"), "--preset", preset,
         "--batch", str(batch), "--steps", str(steps), "--warmup", str(warmup),
         "--seq", str(seq), "--device", device],
        timeout=900,
    )
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="target/release/dflash-top")
    ap.add_argument("--configs", default="qwen3-0.6b:1,qwen3-8b:1",
                    help="preset:batch pairs, comma-separated")
    ap.add_argument("--steps", type=int, default=0,
                    help="dflash-top steps (its last 10 s timed); 0: about 15 s worth a preset")
    ap.add_argument("--peer-steps", type=int, default=20, help="Python steps timed after warm-up")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--fit", help="preset whose largest batch each stack is asked to fit")
    ap.add_argument("--fit-ours", default="16,24,32,40", help="batches tried for dflash-top")
    ap.add_argument("--fit-python", default="2,3,4,5,6", help="batches tried for Python")
    ap.add_argument("--ours-args", default="",
                    help="more `dflash-top bench engine` flags, e.g. \"--target-precision fp8\"")
    ap.add_argument("--peers", default="python,specforge",
                    help="the Python peers to run: python (dflash_peer.py), specforge (sf_peer.py)")
    args = ap.parse_args()

    peak = matmul_peak_tflops(torch.device(args.device))
    print(f"bf16 matmul peak measured now: {peak:.0f} TFLOP/s", flush=True)
    rows = []
    for item in filter(None, args.configs.split(",")):
        preset, batch, *rest = item.split(":")
        batch, seq = int(batch), int(rest[0]) if rest else 3072
        docs = synthetic_docs(seq)
        flops = sum(step_flops(PRESETS[preset], batch, seq=seq, docs=d) for d in docs) / len(docs)
        tokens = batch * seq
        row = {"preset": preset, "batch": batch, "seq": seq, "tflop_per_step": flops / 1e12}
        n_peer = peer_steps(args.peer_steps, seq)
        stacks = [("ours", lambda: ours(args.bin, preset, batch,
                                        ours_steps(preset, batch, args.steps, seq), args.device,
                                        seq, args.ours_args.split())),
                  ("python", lambda: python(preset, batch, n_peer, args.device, seq=seq)),
                  ("specforge", lambda: specforge(preset, batch, n_peer, args.device, seq=seq))]
        peers = args.peers.split(",")
        for name, fn in [(n, f) for n, f in stacks if n == "ours" or n in peers]:
            try:
                r = fn()
                r["mfu"] = r["tok_per_s"] / tokens * flops / (peak * 1e12)
            except Exception as e:  # an out-of-memory config still prints its row
                r = {"error": str(e).strip().splitlines()[-1][:200]}
            r.pop("log", None)
            row[name] = r
            print(f"{preset} batch {batch} {name}: {json.dumps(r)}", flush=True)
        rows.append(row)

    print()
    print("| shapes | batch | seq | dflash-top tok/s | Python tok/s | SpecForge tok/s | vs Python "
          "| vs SpecForge | MFU ours / Python / SpecForge | peak GiB ours / Python / SpecForge |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        o = r["ours"]
        p, f = r.get("python", {}), r.get("specforge", {})

        def cell(x, key, fmt):
            return fmt.format(x[key]) if key in x else ("error" if "error" in x else "–")

        def ratio(x):
            if "tok_per_s" in o and "tok_per_s" in x:
                return f"{o['tok_per_s'] / x['tok_per_s']:.2f}x"
            return "–"

        three = lambda key, fmt: " / ".join(cell(x, key, fmt) for x in (o, p, f))  # noqa: E731
        print(f"| {r['preset']} | {r['batch']} | {r['seq']} | {cell(o, 'tok_per_s', '{:,.0f}')} "
              f"| {cell(p, 'tok_per_s', '{:,.0f}')} | {cell(f, 'tok_per_s', '{:,.0f}')} "
              f"| {ratio(p)} | {ratio(f)} | {three('mfu', '{:.0%}')} "
              f"| {three('peak_allocated_gib', '{:.1f}')} |")
    fit = None
    if args.fit:
        nums = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
        o = largest_batch(args.fit, nums(args.fit_ours),
                          lambda p, b: ours(args.bin, p, b, 6, args.device))
        p = largest_batch(args.fit, nums(args.fit_python),
                          lambda p_, b: python(p_, b, 2, args.device, warmup=1))
        fit = {"preset": args.fit, "ours": o, "python": p}
        ratio = f"{o / p:.1f}x" if o and p else "-"
        print(f"\nlargest batch that fits, {args.fit}: dflash-top {o} rows, Python {p} rows "
              f"({ratio}; batches tried: ours {args.fit_ours}, Python {args.fit_python})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peak_tflops": peak, "ours_args": args.ours_args, "rows": rows, "fit": fit},
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
