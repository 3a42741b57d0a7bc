"""The training runs of python/peer/quality.py: the shared drafter init, one dflash-top run and
one SpecForge run at a given setting, seed and number of target tokens, and the re-run that
matches another run's wall time.

A setting is a dict: dflash-top's {"seq_len", "anchors", "budget", "lr"} (one packed row a
step), SpecForge's {"batch", "lr"} (conversations a step; up to the size's `anchors` per
conversation, as its trainer does). Each run reports `wall_s` (its training loop: dflash-top's
engine, SpecForge's step loop; the models loaded before) and `warm_s`, the same less its first
optimizer step (first-call allocation, and flex attention's compile on CUDA): the equal-wall rows
compare `warm_s`.
"""

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

import sf_train

# SpecForge's published DFlash recipe (examples/configs/.../qwen3-8b-dflash-*.yaml): warm-up 4%,
# grad clip 1.0, loss decay gamma 7 for block 16; dflash-top's recipe has the same.
WARMUP, CLIP = 0.04, 1.0


def gamma_for(block):
    return 4.0 if block <= 8 else 5.0 if block <= 10 else 7.0


def log(msg):
    print(f"[quality {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def label(trainer, setting):
    """A setting in words, for the table: `batch 1, lr 0.003` or `seq 256, 64 per-row, lr 0.003`."""
    if trainer == "specforge":
        return f"batch {setting['batch']}, lr {setting['lr']:g}"
    k = setting.get("steps_per_batch", 1)
    steps = ", a step a doc" if k == "doc" else f", {k} steps/row" if k > 1 else ""
    return (f"seq {setting['seq_len']}, {setting['anchors']} {setting['budget']}{steps}, "
            f"lr {setting['lr']:g}")  # fmt: skip


def make_init(work, s, target_dir, mask_id, seed):
    """A random DFlashDraftModel (z-lab dflash's class) for `seed`, saved; both trainers start
    from it."""
    from transformers import AutoConfig, Qwen3Config

    from dflash.model import DFlashDraftModel, build_target_layer_ids

    t = AutoConfig.from_pretrained(target_dir)
    n = s["drafter_layers"]
    cfg = Qwen3Config(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads,
        rms_norm_eps=t.rms_norm_eps,
        max_position_embeddings=t.max_position_embeddings,
        rope_parameters=t.rope_parameters,
        tie_word_embeddings=False,
        architectures=["DFlashDraftModel"],
        num_target_layers=t.num_hidden_layers,
        block_size=s["block"],
        dflash_config={
            "target_layer_ids": build_target_layer_ids(t.num_hidden_layers, n),
            "mask_token_id": mask_id,
            "block_size": s["block"],
        },
    )
    torch.manual_seed(7 + seed)
    d = os.path.join(work, f"init-{seed}")
    DFlashDraftModel(cfg).float().save_pretrained(d, safe_serialization=True)
    return d


def field(line, key):
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", line)
    try:
        return float(m.group(1).rstrip("s")) if m else None
    except ValueError:
        return None


def reused(ctx, d, key):
    """A run's result when --work was given and the run is there for the same settings."""
    try:
        with open(os.path.join(d, "quality-run.json")) as f:
            r = json.load(f)
    except OSError:
        return None
    if ctx["reuse"] and r.get("key") == key:
        log(f"{os.path.basename(d)}: reusing {d}")
        return r["result"]
    return None


def keep(d, key, result):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "quality-run.json"), "w") as f:
        json.dump({"key": key, "result": result}, f)
    return result


def first_step_end(trace, per_step):
    """When dflash-top's first optimizer step ended, from its interval lines [(tokens, t)]: the
    first line past step 1, less the steps after the first it had done at the run's later pace."""
    pts = [(x / per_step, t) for x, t in trace if x >= per_step]
    if not pts:
        return 0.0
    (s1, t1), (sn, tn) = pts[0], pts[-1]
    pace = (tn - t1) / (sn - s1) if sn > s1 else 0.0
    return max(0.0, t1 - (s1 - 1) * pace)


def at_step(trace, per_step, step):
    """Seconds into a dflash-top run at `step`, interpolated between its interval lines."""
    pts = [(x / per_step, t) for x, t in trace]
    for (s0, t0), (s1, t1) in zip(pts, pts[1:]):
        if s0 <= step <= s1 and s1 > s0:
            return t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    return pts[-1][1] if pts else 0.0


def run_ours(ctx, name, setting, seed, tokens, points=1):
    """dflash-top's run; with `points` > 1, checkpoints along it for a learning curve."""
    s = ctx["s"]
    k = setting.get("steps_per_batch", 1)
    # Optimizer steps (--steps counts them): k for each packed row of seq_len tokens; with a step
    # a document ("doc"), about one for each conversation of the data's mean length (the run's
    # own count of tokens read is what the table keeps).
    if k == "doc":
        mean = sum(len(ids) for ids, _ in ctx["samples"]) / max(1, len(ctx["samples"]))
        steps = max(1, round(tokens / mean))
    else:
        steps = max(1, round(tokens / setting["seq_len"])) * k
    per_step = tokens / steps if k == "doc" else setting["seq_len"] / k
    every = max(1, steps // points)
    key = digest([ctx["key"], "ours", setting, seed, steps, ctx["device"], ctx["bin_id"], points])
    save = os.path.join(ctx["work"], f"{name}-{key[:8]}")  # one directory per run
    if (r := reused(ctx, save, key)) is not None:
        return r
    shutil.rmtree(save, ignore_errors=True)
    dev = "cuda:0" if ctx["device"] == "cuda" else "cpu"
    cmd = [
        ctx["bin"], "train", "--headless", "--target", ctx["target_dir"], "--data",
        ctx["train_jsonl"], "--drafter", ctx["init"][seed], "--steps", str(steps),
        "--save-dir", save, "--save-every", str(every), "--seed", str(seed),
        "--interval", "0.2", "--block-size", str(s["block"]),
        "--drafter-layers", str(s["drafter_layers"]), "--seq-len", str(setting["seq_len"]),
        "--anchors", str(setting["anchors"]), "--anchor-budget", setting["budget"],
        "--batch", "1", "--steps-per-batch", str(k), "--lr", str(setting["lr"]), "--mask-token-id", str(ctx["mask_id"]),
        "--target-devices", dev, "--drafter-devices", dev,
    ]  # fmt: skip
    if setting.get("target_precision"):
        cmd += ["--target-precision", setting["target_precision"]]
    if setting.get("optimizer_states"):
        cmd += ["--optimizer-states", setting["optimizer_states"]]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr}")
    lines = r.stdout.splitlines()
    summary = next((x for x in reversed(lines) if x.startswith("summary:")), "")
    # The data the steps read: its documents' tokens, the padding of its packed rows out
    # (SpecForge's batch of one conversation has none), as dflash-top counts them.
    data_line = next((x for x in reversed(lines) if x.startswith("data:")), "")
    if field(data_line, "doc_tokens"):
        per_step = field(data_line, "doc_tokens") / steps
    late = [
        field(x, "tau")
        for x in lines
        if x.startswith("t=") and (field(x, "step") or 0) >= 0.75 * steps
    ]
    late = [x for x in late if x is not None and math.isfinite(x)]
    # (target tokens, seconds) along the run, from the interval lines.
    trace = [
        (field(x, "step") * per_step, field(x, "t"))
        for x in lines
        if x.startswith("t=") and field(x, "step") is not None and field(x, "t") is not None
    ]
    tau = sum(late) / len(late) if late else field(summary, "tau")
    ckpt = os.path.join(save, f"step-{steps:06d}")
    if not os.path.isdir(ckpt):
        raise SystemExit(f"dflash-top saved no {ckpt}: {os.listdir(save)}\n{summary}")
    wall = field(summary, "elapsed") or process_s
    first = first_step_end(trace, per_step)
    # (step, target tokens, seconds after the first step, checkpoint) along the run.
    curve = [
        (i, round(i * per_step), max(0.0, at_step(trace, per_step, i) - first),
         os.path.join(save, f"step-{i:06d}"))
        for i in range(every, steps, every)
        if points > 1
    ] + [(steps, round(steps * per_step), max(1e-3, wall - first), ckpt)]  # fmt: skip
    log(f"{name}: {summary}")
    return keep(save, key, {
        "trainer": "dflash-top",
        "setting": setting,
        "seed": seed,
        "steps": steps,
        "target_tokens": round(steps * per_step),
        "wall_s": wall,
        "first_step_s": first,
        "warm_s": max(1e-3, wall - first),
        "process_s": process_s,
        "final_loss": field(summary, "loss"),
        "tau": tau,
        "drafter": ckpt,
        "trace": trace,
        "curve": curve,
    })  # fmt: skip


def run_specforge(ctx, name, setting, seed, tokens, points=1):
    """SpecForge's run; with `points` > 1, its drafter saved along it for a learning curve."""
    s = ctx["s"]
    key = digest([ctx["key"], "specforge", setting, seed, tokens, ctx["device"], points])
    out = os.path.join(ctx["work"], f"{name}-{key[:8]}")  # one directory per run
    steps, _ = sf_train.plan_steps(ctx["samples"], tokens, setting["batch"], s["max_length"])
    if (r := reused(ctx, out, key)) is not None:
        return r
    shutil.rmtree(out, ignore_errors=True)
    res = sf_train.train(
        target_dir=ctx["target_dir"],
        init_dir=ctx["init"][seed],
        samples=ctx["samples"],
        tokens=tokens,
        out_dir=out,
        max_length=s["max_length"],
        batch_size=setting["batch"],
        lr=setting["lr"],
        warmup_ratio=WARMUP,
        max_grad_norm=CLIP,
        num_anchors=s["anchors"],
        gamma=gamma_for(s["block"]),
        device=torch.device(ctx["device"]),
        seed=seed,
        log=log,
        save_every=max(1, steps // points) if points > 1 else None,
    )
    res["curve"] = [(k, x, t, os.path.join(out, f"step-{k:06d}") if k < steps else out)
                    for k, x, t in res["curve"]]  # fmt: skip
    log(f"{name}: { {k: v for k, v in res.items() if k != 'trace'} }")
    return keep(out, key, {"trainer": "specforge", "setting": setting, "seed": seed, **res,
                           "drafter": out})  # fmt: skip


def fit_wall(run):
    """(fixed seconds, seconds per target token) of a run's warm-up-excluded time: a line through
    its trace over the second half of the run."""
    pts = [(x, t) for x, t in run.get("trace", []) if x >= run["target_tokens"] / 2]
    if len(pts) < 2:
        return 0.0, run["warm_s"] / run["target_tokens"]
    mx = sum(x for x, _ in pts) / len(pts)
    mt = sum(t for _, t in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (t - mt) for x, t in pts) / sxx if sxx > 0 else 0.0
    if b <= 0:
        return 0.0, run["warm_s"] / run["target_tokens"]
    a = max(0.0, run["warm_s"] - b * run["target_tokens"])
    return a, b


def match_wall(base, wall, train, tries=3, within=0.1):
    """A fresh run of the trainer of `base` whose `warm_s` is within 10% of `wall`: the tokens are
    extrapolated from the latest run (fit_wall), and the run is made again, up to `tries` times,
    while a busy machine's speed moves it further off. Returns the closest run."""
    best, last = None, base
    for i in range(tries):
        a, b = fit_wall(last)
        r = train(max(1, round((wall - a) / b)), i)
        r["wall_tries"] = i + 1
        if best is None or abs(r["warm_s"] - wall) < abs(best["warm_s"] - wall):
            best = r
        if abs(r["warm_s"] - wall) <= within * wall:
            break
        last = r
    return best


def _run_one(job):
    ctx, trainer, name, setting, seed, tokens = job
    run = run_ours if trainer == "dflash-top" else run_specforge
    return run(ctx, name, setting, seed, tokens)


def run_many(ctx, jobs, procs=1):
    """The runs of `jobs`, a list of (trainer, name, setting, seed, tokens), in order; with
    `procs` > 1 that many side by side, each SpecForge run in a process of its own. Runs side by
    side share the machine, so their seconds are not a pace: only rows whose tokens, not
    seconds, are compared (the sweep) run this way."""
    jobs = [(ctx, *j) for j in jobs]
    if procs <= 1 or len(jobs) <= 1:
        return [_run_one(j) for j in jobs]
    log(f"{len(jobs)} runs, {procs} side by side")
    with ProcessPoolExecutor(max_workers=min(procs, len(jobs)),
                             mp_context=get_context("spawn")) as pool:  # fmt: skip
        return list(pool.map(_run_one, jobs))
