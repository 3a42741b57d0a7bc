"""Acceptance side by side, one command: a drafter trained by dflash-top against one trained by
SpecForge 0.2.0's own DFlash trainer, both measured with z-lab dflash 0.1.0's speculative
decoding on held-out prompts.

    .venv/bin/python python/peer/quality.py --size ci [--json OUT]        # ~1 min, 2 cores
    python python/peer/quality.py --size gpu --device cuda --work W --until tokens
    python python/peer/quality.py --size gpu --device cuda --work W --json OUT [--anchor-budget both]

The GPU size needs torch, transformers, the `dflash` and `specforge` packages (PYTHONPATH will
do) and pydantic (SpecForge's chat parser imports it), and the release binary (--bin, default
target/release/dflash-top). It runs in parts with one --work directory: what is there for the
same settings is reused (the target, the data, each training run).

1. A small Qwen3 target learns the chat language of chat_lang.py (topics read from the latest
   user turn, replies of several lengths that end with `<|im_end|>`, multi-turn conversations
   rendered through a ChatML template), trained here with transformers; saved as a Hugging Face
   directory with its tokenizer.json and chat template.
2. The target writes its own greedy replies, turn by turn (`dflash-top generate`, which renders
   the chat template; --gen-procs processes at once, 8 on a GPU); SpecForge's chat parser
   (`GeneralParser`, its `qwen`-style template) turns each conversation into `input_ids` +
   `loss_mask` (the assistant turns as rendered). Held-out conversations give the evaluation
   prompts (their last turn).
3. One random DFlashDraftModel init (z-lab dflash's class) is saved; dflash-top starts from it
   (`--drafter`), SpecForge warm-starts from it. Both train on the same conversations in the
   same order, with the same recipe numbers (lr, 4% warm-up, cosine, clip 1.0, gamma 7 for
   block 16, anchors), for the same number of target tokens; then the faster of the two trains
   again (a fresh run) for as many tokens as match the slower one's wall time.
4. Each drafter (and the untrained init, as a floor) drafts for the target in
   `dflash.model.dflash_generate` (greedy) on the held-out prompts: acceptance length per prompt
   (tokens per round), mean and 95% interval over prompts.
5. Prints the table and writes it as JSON (--json).

Every stage writes into --work (a temporary directory unless given); with --work given, a stage
whose output is there for the same settings is reused (the target and the data), so the GPU size
can run in parts (--until data or --until tokens, then again without it).
"""

import argparse
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import chat_lang as cl  # noqa: E402
import sf_train  # noqa: E402

SIZES = {
    # The CPU size: a few minutes on two cores, in `make test`.
    "ci": {
        "lang": {"words": 128, "topics": 2, "fillers": 8, "seed": 1},
        "target": {
            "shape": {
                "hidden": 64,
                "intermediate": 192,
                "layers": 6,
                "heads": 4,
                "kv_heads": 2,
                "head_dim": 16,
            },
            "steps": 100,
            "batch": 16,
            "lr": 3e-3,
            "noise": 0.05,
        },
        "buckets": [(8, 16), (20, 40), (50, 100)],
        "max_turns": 2,
        "budget": 220,
        "max_length": 256,
        "train_convs": 96,
        "eval_convs": 16,
        "drafter_layers": 2,
        "block": 16,
        "anchors": 64,
        "ours_batch": 1,
        "sf_batch": "match",
        "lr": 3e-3,
        "tokens": 48 * 256,
        "eval_max_new": 128,
        "floor_prompts": 16,
        "threads": 1,
    },
    # The GPU size (one H200): replies of 50 to 1,500 tokens, up to 3 turns, rows of 3,072.
    "gpu": {
        "lang": {"words": 1600, "topics": 4, "fillers": 32, "seed": 1},
        "target": {
            "shape": {
                "hidden": 512,
                "intermediate": 1536,
                "layers": 8,
                "heads": 8,
                "kv_heads": 4,
                "head_dim": 64,
            },
            "steps": 800,
            "batch": 16,
            "lr": 1e-3,
            "noise": 0.03,
        },
        "buckets": [(50, 100), (200, 400), (800, 1500)],
        "max_turns": 3,
        "budget": 2900,
        "max_length": 3072,
        "train_convs": 160,
        "eval_convs": 24,
        "drafter_layers": 5,
        "block": 16,
        "anchors": 512,
        "ours_batch": 1,
        "sf_batch": "match",
        "lr": 6e-4,
        # 32 steps: training still going on. At 600 steps (1.84M tokens) every trainer reaches the
        # data's ceiling (docs/quality.md) and the table can no longer tell them apart.
        "tokens": 32 * 3072,
        "eval_max_new": 384,
        "floor_prompts": 8,
        "threads": None,
    },
}
# SpecForge's published DFlash recipe (examples/configs/.../qwen3-8b-dflash-*.yaml): warm-up 4%,
# grad clip 1.0, loss decay gamma 7 for block 16; dflash-top's recipe has the same.
WARMUP, CLIP = 0.04, 1.0


def gamma_for(block):
    return 4.0 if block <= 8 else 5.0 if block <= 10 else 7.0


def log(msg):
    print(f"[quality {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def digest(obj):
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def cached(d, key):
    try:
        with open(os.path.join(d, "quality-stage.json")) as f:
            return json.load(f).get("key") == key
    except OSError:
        return False


def mark(d, key, extra=None):
    with open(os.path.join(d, "quality-stage.json"), "w") as f:
        json.dump({"key": key, **(extra or {})}, f)


# ---------------------------------------------------------------------------------------------
# 1. The target


def make_target(work, size, lang, device, steps=None):
    d = os.path.join(work, "target")
    conf = dict(SIZES[size]["target"])
    if steps:
        conf["steps"] = steps
    conf.update(
        seed=0,
        max_length=SIZES[size]["max_length"],
        buckets=SIZES[size]["buckets"],
        max_turns=SIZES[size]["max_turns"],
        budget=SIZES[size]["budget"],
    )
    key = digest({"lang": SIZES[size]["lang"], "target": conf, "v": 1})
    tokenizer = cl.write_tokenizer(d, lang, SIZES[size]["max_length"])
    if cached(d, key):
        log(f"target: reusing {d}")
        return d, tokenizer
    t0 = time.time()
    cl.train_target(d, conf["shape"], lang, tokenizer, conf, device, log)
    mark(d, key, {"train_s": time.time() - t0})
    log(f"target: trained in {time.time() - t0:.0f}s, saved to {d}")
    return d, tokenizer


# ---------------------------------------------------------------------------------------------
# 2. The data: the target's own greedy replies, turn by turn


def generate_sharded(work, name, binary, target, lines, max_new, device, procs):
    """The target's greedy replies to the prompts in `lines`, in their order: `procs` concurrent
    `dflash-top generate` processes, each on a contiguous share (one prompt at a time is
    launch-bound on a GPU, so several processes fill it)."""
    procs = max(1, min(procs, len(lines)))
    bounds = [len(lines) * k // procs for k in range(procs + 1)]
    jobs = []
    for k in range(procs):
        prompts = os.path.join(work, f"{name}-{k}-prompts.jsonl")
        out = os.path.join(work, f"{name}-{k}-greedy.jsonl")
        with open(prompts, "w") as f:
            f.writelines(lines[bounds[k] : bounds[k + 1]])
        cmd = [
            binary, "generate", "--target", target, "--data", prompts, "--out", out,
            "--max-new-tokens", str(max_new), "--device", device,
        ]  # fmt: skip
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        jobs.append((cmd, p, out, bounds[k + 1] - bounds[k]))
    rows = []
    for cmd, p, out, n in jobs:
        err = p.communicate()[1]
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
        got = [json.loads(x) for x in open(out) if x.strip()]
        assert len(got) == n, f"{out}: {len(got)} lines for {n} prompts"
        rows += got
    return rows


def generate_turns(
    work, name, binary, target, tokenizer, lang, convs, max_new, device, check, procs=1
):
    """Fills in each conversation's assistant turns with the target's greedy replies, one
    `dflash-top generate` call (or `procs` concurrent ones) per turn index. Returns the
    conversations as messages and the replies (ids, end token included) of their last turns."""
    inv = {v: k for k, v in tokenizer.get_vocab().items()}
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    msgs = [[{"role": "system", "content": cl.SYSTEM_PROMPT}] for _ in convs]
    last = [None] * len(convs)
    stats = {"replies": 0, "ended": 0, "rule_ok": 0, "rule_n": 0, "stop_ok": 0}
    rng = random.Random(f"{name}-users")
    for turn in range(max(len(c) for c in convs)):
        live = [i for i, c in enumerate(convs) if len(c) > turn]
        lines = []
        for i in live:
            k, seed, _ = convs[i][turn]
            msgs[i].append({"role": "user", "content": cl.user_message(rng, lang, k, seed)})
            lines.append(json.dumps({"messages": msgs[i]}) + "\n")
        rows = generate_sharded(
            work, f"{name}-turn{turn}", binary, target, lines, max_new, device, procs
        )
        for i, row in zip(live, rows):
            ids, mask = row["input_ids"], row["loss_mask"]
            n = mask.index(1) if 1 in mask else len(ids)
            if check:
                # dflash-top renders the chat template as transformers does.
                want = cl.encode(tokenizer, cl.render(tokenizer, msgs[i], True))
                assert ids[:n] == want, (
                    "dflash-top generate rendered the chat template differently from "
                    f"transformers:\n{ids[:n]}\n{want}"
                )
                check = False
            reply = ids[n:]
            ended = bool(reply) and reply[-1] == eos
            words = [inv[x] for x in (reply[:-1] if ended else reply)]
            msgs[i].append({"role": "assistant", "content": " ".join(words)})
            last[i] = reply
            k = convs[i][turn][0]
            nums = [int(x[1:]) for x in words if re.fullmatch(r"w\d+", x)]
            ok, tot, stop = lang.follows(k, nums)
            stats["replies"] += 1
            stats["ended"] += ended
            stats["rule_ok"] += ok
            stats["rule_n"] += tot
            stats["stop_ok"] += stop and ended and len(nums) == len(words)
    return msgs, last, stats


def make_data(work, size, binary, target_dir, tokenizer, lang, gen_device, procs=1):
    """train.jsonl (input_ids + loss_mask, for dflash-top; SpecForge reads the same lines) and
    eval.jsonl (prompt + the target's reply of the last turn)."""
    from specforge.data.loss_mask import has_consecutive_supervised_tokens
    from specforge.data.parse import GeneralParser
    from specforge.data.template import ChatTemplate

    s = SIZES[size]
    d = os.path.join(work, "data")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(target_dir, "model.safetensors"), "rb") as f:
        target_id = hashlib.sha256(f.read()).hexdigest()[:16]
    key = digest({k: s[k] for k in ("lang", "buckets", "max_turns", "budget", "max_length",
                                    "train_convs", "eval_convs")} | {"target": target_id, "v": 1})
    if cached(d, key):
        log(f"data: reusing {d}")
        with open(os.path.join(d, "quality-stage.json")) as f:
            return d, key, json.load(f)["stats"]
    t0 = time.time()
    rng = random.Random(12345)
    convs = [
        cl.sample_turns(rng, lang, s["buckets"], s["max_turns"], s["budget"])
        for _ in range(s["train_convs"] + s["eval_convs"])
    ]
    max_new = max(hi for _, hi in s["buckets"]) + 8
    train_msgs, _, st_train = generate_turns(
        d, "train", binary, target_dir, tokenizer, lang, convs[: s["train_convs"]], max_new,
        gen_device, True, procs,
    )  # fmt: skip
    eval_msgs, eval_last, st_eval = generate_turns(
        d, "eval", binary, target_dir, tokenizer, lang, convs[s["train_convs"] :], max_new,
        gen_device, False, procs,
    )  # fmt: skip

    # SpecForge's chat parser, with a qwen-style ChatTemplate (as its `qwen` template, with our
    # system prompt): loss on each assistant turn as rendered, `<|im_end|>\n` included.
    parser = GeneralParser(
        tokenizer,
        ChatTemplate(
            assistant_header="<|im_start|>assistant\n",
            user_header="<|im_start|>user\n",
            system_prompt=cl.SYSTEM_PROMPT,
            end_of_turn_token="<|im_end|>\n",
        ),
    )
    kept = dropped = tokens = supervised = 0
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for m in train_msgs:
            ids, mask = parser.parse(m, s["max_length"])
            if not has_consecutive_supervised_tokens(mask):
                dropped += 1
                continue
            kept += 1
            tokens += len(ids)
            supervised += int(mask.sum())
            f.write(json.dumps({"input_ids": ids.tolist(), "loss_mask": mask.tolist()}) + "\n")
    with open(os.path.join(d, "eval.jsonl"), "w") as f:
        for m, reply in zip(eval_msgs, eval_last):
            prompt = cl.encode(tokenizer, cl.render(tokenizer, m[:-1], True))
            f.write(json.dumps({"prompt": prompt, "reply": reply}) + "\n")
    stats = {
        "train_conversations": kept,
        "dropped_under_2_loss_tokens": dropped,
        "train_tokens": tokens,
        "train_supervised_tokens": supervised,
        "target_replies": st_train["replies"] + st_eval["replies"],
        "replies_ended": st_train["ended"] + st_eval["ended"],
        "replies_ended_at_stop_word": st_train["stop_ok"] + st_eval["stop_ok"],
        "rule_follow": (st_train["rule_ok"] + st_eval["rule_ok"])
        / max(1, st_train["rule_n"] + st_eval["rule_n"]),
        "gen_s": time.time() - t0,
    }
    mark(d, key, {"stats": stats})
    log(f"data: {json.dumps(stats)}")
    return d, key, stats


# ---------------------------------------------------------------------------------------------
# 3. The shared init and the two trainers


def make_init(work, size, target_dir, tokenizer):
    from transformers import AutoConfig, Qwen3Config

    from dflash.model import DFlashDraftModel, build_target_layer_ids

    s = SIZES[size]
    t = AutoConfig.from_pretrained(target_dir)
    n = s["drafter_layers"]
    mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    cfg = Qwen3Config(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size,
        num_hidden_layers=n,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=t.num_key_value_heads,
        head_dim=t.head_dim,
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
            "mask_token": "<|mask|>",
            "block_size": s["block"],
        },
    )
    torch.manual_seed(7)
    d = os.path.join(work, "init")
    DFlashDraftModel(cfg).float().save_pretrained(d, safe_serialization=True)
    return d, mask_id


def field(line, key):
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", line)
    try:
        return float(m.group(1).rstrip("s")) if m else None
    except ValueError:
        return None


def reused(args, d, key):
    """A run's result when --work was given and the run is there for the same settings."""
    try:
        with open(os.path.join(d, "quality-run.json")) as f:
            r = json.load(f)
    except OSError:
        return None
    if args.work and r.get("key") == key:
        log(f"{os.path.basename(d)}: reusing {d}")
        return r["result"]
    return None


def keep(d, key, result):
    with open(os.path.join(d, "quality-run.json"), "w") as f:
        json.dump({"key": key, "result": result}, f)
    return result


def run_ours(args, size, work, name, target_dir, train_jsonl, init_dir, mask_id, tokens, budget):
    s = SIZES[size]
    per_step = s["ours_batch"] * s["max_length"]
    steps = max(1, round(tokens / per_step))
    save = os.path.join(work, name)
    key = digest([args.key, "ours", budget, steps, args.device, args.bin_id])
    if (r := reused(args, save, key)) is not None:
        return r
    shutil.rmtree(save, ignore_errors=True)
    dev = "cuda:0" if args.device == "cuda" else "cpu"
    cmd = [
        args.bin, "train", "--headless", "--target", target_dir, "--data", train_jsonl,
        "--drafter", init_dir, "--steps", str(steps), "--save-dir", save,
        "--save-every", str(steps), "--seed", "0", "--interval", "1",
        "--block-size", str(s["block"]), "--drafter-layers", str(s["drafter_layers"]),
        "--seq-len", str(s["max_length"]), "--anchors", str(s["anchors"]),
        "--anchor-budget", budget, "--batch", str(s["ours_batch"]), "--lr", str(s["lr"]),
        "--mask-token-id", str(mask_id), "--target-devices", dev, "--drafter-devices", dev,
    ]  # fmt: skip
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    process_s = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr}")
    lines = r.stdout.splitlines()
    summary = next((x for x in reversed(lines) if x.startswith("summary:")), "")
    late = [
        field(x, "tau")
        for x in lines
        if x.startswith("t=") and (field(x, "step") or 0) >= 0.75 * steps
    ]
    late = [x for x in late if x is not None and math.isfinite(x)]
    # (target tokens, seconds) along the run, from the interval lines, for fit_wall.
    trace = [
        (field(x, "step") * per_step, field(x, "t"))
        for x in lines
        if x.startswith("t=") and field(x, "step") is not None and field(x, "t") is not None
    ]
    tau = sum(late) / len(late) if late else field(summary, "tau")
    ckpt = os.path.join(save, f"step-{steps:06d}")
    if not os.path.isdir(ckpt):
        raise SystemExit(f"dflash-top saved no {ckpt}: {os.listdir(save)}\n{summary}")
    log(f"{name}: {summary}")
    return keep(save, key, {
        "trainer": "dflash-top",
        "anchor_budget": budget,
        "steps": steps,
        "target_tokens": steps * per_step,
        "wall_s": field(summary, "elapsed") or process_s,
        "process_s": process_s,
        "final_loss": field(summary, "loss"),
        "tau": tau,
        "drafter": ckpt,
        "trace": trace,
    })


def fit_wall(run):
    """(fixed seconds, seconds per target token) of a run: a line through its trace over the
    second half of the run (start-up, first-step compilation and the like go into the fixed
    part)."""
    pts = [(x, t) for x, t in run.get("trace", []) if x >= run["target_tokens"] / 2]
    if len(pts) < 2:
        return 0.0, run["wall_s"] / run["target_tokens"]
    mx = sum(x for x, _ in pts) / len(pts)
    mt = sum(t for _, t in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (t - mt) for x, t in pts) / sxx if sxx > 0 else 0.0
    if b <= 0:
        return 0.0, run["wall_s"] / run["target_tokens"]
    a = max(0.0, run["wall_s"] - b * run["target_tokens"])
    return a, b


def tokens_for_wall(run, wall):
    a, b = fit_wall(run)
    return max(1, round((wall - a) / b))


def match_wall(base, wall, train, tries=3, within=0.1):
    """A fresh run of the trainer of `base` whose wall time is within 10% of `wall`: the tokens
    are extrapolated from the latest run (fit_wall), and the run is made again, up to `tries`
    times, while a busy machine's speed moves it further off. Returns the closest run."""
    best, last = None, base
    for i in range(tries):
        r = train(tokens_for_wall(last, wall), i)
        r["wall_tries"] = i + 1
        if best is None or abs(r["wall_s"] - wall) < abs(best["wall_s"] - wall):
            best = r
        if abs(r["wall_s"] - wall) <= within * wall:
            break
        last = r
    return best


def matched_batch(s, stats):
    """SpecForge's batch (conversations a step) that takes as many target tokens a step as our
    packed rows do, so that both take the same number of optimizer steps for the same tokens:
    at these early, steep points of training, steps decide acceptance more than any rule of the
    recipe (SpecForge's own example batch of 4 conversations of up to 3,072 tokens takes more
    tokens a step than one row of 3,072 does)."""
    per_conv = stats["train_tokens"] / max(1, stats["train_conversations"])
    return max(1, round(s["ours_batch"] * s["max_length"] / per_conv))


def run_specforge(args, size, work, name, target_dir, samples, init_dir, tokens):
    s = SIZES[size]
    out = os.path.join(work, name)
    key = digest([args.key, "specforge", tokens, args.device])
    if (r := reused(args, out, key)) is not None:
        return r
    shutil.rmtree(out, ignore_errors=True)
    res = sf_train.train(
        target_dir=target_dir,
        init_dir=init_dir,
        samples=samples,
        tokens=tokens,
        out_dir=out,
        max_length=s["max_length"],
        batch_size=s["sf_batch"],
        lr=s["lr"],
        warmup_ratio=WARMUP,
        max_grad_norm=CLIP,
        num_anchors=s["anchors"],
        gamma=gamma_for(s["block"]),
        device=torch.device(args.device),
        seed=0,
        log=log,
    )
    log(f"{name}: {res}")
    return keep(out, key, {"trainer": "specforge", "anchor_budget": "per-doc", **res,
                           "drafter": out})


# ---------------------------------------------------------------------------------------------
# 4. Acceptance in dflash


def measure(drafter_dir, target, eval_rows, device, dtype, max_new):
    import dflash.model as dm
    from dflash.model import DFlashDraftModel

    drafter = DFlashDraftModel.from_pretrained(drafter_dir).to(device=device, dtype=dtype).eval()
    eos = target.config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    per_prompt, same = [], 0
    for row in eval_rows:
        prompt, reply = row["prompt"], row["reply"][:max_new]
        out = dm.dflash_generate(
            drafter,
            target,
            torch.tensor([prompt], device=device),
            len(reply),
            eos,
            return_stats=True,
        )
        per_prompt.append(sum(out.acceptance_lengths) / len(out.acceptance_lengths))
        same += out.output_ids[0].tolist() == prompt + reply
    return per_prompt, same


# Two-sided 95% quantiles of Student's t (df 1..30), then the normal's.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042]  # fmt: skip


def mean_ci(xs):
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, m, m
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    t = T95[n - 2] if n - 1 <= len(T95) else 1.96
    h = t * sd / math.sqrt(n)
    return m, m - h, m + h


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="ci")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", help="write the table as JSON here")
    ap.add_argument("--work", help="working directory (kept; stages reused); default: a temp dir")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/dflash-top"))
    ap.add_argument("--tokens", type=int, help="target tokens of the equal-tokens runs")
    ap.add_argument("--target-steps", type=int, help="training steps of the target")
    ap.add_argument(
        "--anchor-budget",
        default="per-row",
        help="dflash-top's --anchor-budget: per-row (its default), per-doc, or both (one row each)",
    )
    ap.add_argument("--threads", type=int, help="torch intra-op threads of the Python stages")
    ap.add_argument(
        "--until", choices=["target", "data", "tokens"], help="stop after this stage"
    )
    ap.add_argument(
        "--gen-procs",
        type=int,
        help="concurrent `dflash-top generate` processes for the data (8 on cuda, 1 on cpu)",
    )
    args = ap.parse_args()

    s = SIZES[args.size]
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    threads = args.threads or s["threads"]
    if threads:
        torch.set_num_threads(threads)
    if not os.access(args.bin, os.X_OK):
        raise SystemExit(f"{args.bin} is not an executable: build it (cargo build --release)")
    with open(args.bin, "rb") as f:
        args.bin_id = hashlib.sha256(f.read()).hexdigest()[:16]
    gen_procs = args.gen_procs or (8 if args.device == "cuda" else 1)
    budgets = ["per-doc", "per-row"] if args.anchor_budget == "both" else [args.anchor_budget]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    tmp = None
    work = args.work
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="dflash-quality-")
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    random.seed(0)
    torch.manual_seed(0)
    started = time.time()

    lang = cl.Lang(**s["lang"])
    target_dir, tokenizer = make_target(work, args.size, lang, device, args.target_steps)
    if args.until == "target":
        return
    gen_device = "cuda:0" if args.device == "cuda" else "cpu"
    data_dir, data_key, data_stats = make_data(
        work, args.size, args.bin, target_dir, tokenizer, lang, gen_device, gen_procs
    )
    if s["sf_batch"] == "match":
        s = dict(s, sf_batch=matched_batch(s, data_stats))
        SIZES[args.size] = s
    args.key = digest([data_key, {k: v for k, v in s.items() if k != "threads"}])
    if args.until == "data":
        return
    if data_stats["rule_follow"] < 0.9:
        raise SystemExit(
            f"the target follows its language on {data_stats['rule_follow']:.0%} of its reply "
            "tokens only: train it longer (--target-steps)"
        )
    train_jsonl = os.path.join(data_dir, "train.jsonl")
    samples = [
        (r["input_ids"], r["loss_mask"]) for r in map(json.loads, open(train_jsonl)) if r
    ]
    eval_rows = [json.loads(x) for x in open(os.path.join(data_dir, "eval.jsonl")) if x.strip()]
    init_dir, mask_id = make_init(work, args.size, target_dir, tokenizer)
    tokens = args.tokens or s["tokens"]

    # Equal target tokens.
    runs = []
    for b in budgets:
        runs.append(
            run_ours(args, args.size, work, f"ours-{b}-tokens", target_dir, train_jsonl,
                     init_dir, mask_id, tokens, b)
        )  # fmt: skip
        runs[-1]["row"] = "equal tokens"
    sf = run_specforge(args, args.size, work, "specforge-tokens", target_dir, samples, init_dir,
                       runs[0]["target_tokens"])  # fmt: skip
    sf["row"] = "equal tokens"
    runs.append(sf)
    if args.until == "tokens":
        return
    # Equal wall time: the faster trainer trains again (a fresh run, its own schedule) for the
    # tokens its own throughput gives in the slower one's wall time.
    ours0 = runs[0]
    if ours0["wall_s"] <= sf["wall_s"]:
        for b in budgets:
            base = next(r for r in runs if r["trainer"] == "dflash-top" and r["anchor_budget"] == b)
            r = match_wall(
                base,
                sf["wall_s"],
                lambda n, i, b=b: run_ours(args, args.size, work, f"ours-{b}-wall{i}",
                                           target_dir, train_jsonl, init_dir, mask_id, n, b),
            )  # fmt: skip
            r["row"] = "equal wall"
            runs.append(r)
        runs.append({**sf, "row": "equal wall", "same_run_as": "specforge equal tokens"})
    else:
        r = match_wall(
            sf,
            ours0["wall_s"],
            lambda n, i: run_specforge(args, args.size, work, f"specforge-wall{i}", target_dir,
                                       samples, init_dir, n),
        )  # fmt: skip
        r["row"] = "equal wall"
        for b in budgets:
            base = next(x for x in runs if x["trainer"] == "dflash-top" and x["anchor_budget"] == b)
            runs.append({**base, "row": "equal wall", "same_run_as": f"dflash-top {b} equal tokens"})
        runs.append(r)

    # Acceptance in dflash.
    import dflash.model as dm
    from transformers import Qwen3ForCausalLM

    if args.device == "cpu":
        dm._cuda_time = time.perf_counter  # dflash times its stats with torch.cuda.synchronize()
    target = Qwen3ForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    measured = {}
    for key, d in [("untrained", init_dir)] + [(r["drafter"], r["drafter"]) for r in runs]:
        if key in measured:
            continue
        t0 = time.time()
        rows_here = eval_rows[: s["floor_prompts"]] if key == "untrained" else eval_rows
        per, same = measure(d, target, rows_here, device, dtype, s["eval_max_new"])
        measured[key] = (per, same)
        log(f"dflash: {os.path.basename(d)} acceptance {sum(per) / len(per):.3f} "
            f"({same}/{len(per)} outputs as greedy, {time.time() - t0:.0f}s)")  # fmt: skip
    floor = measured["untrained"][0]
    rows = [{"trainer": "untrained init", "row": "floor", "target_tokens": 0, "wall_s": 0.0,
             "tau": None, "per_prompt": floor}]  # fmt: skip
    for r in runs:
        rows.append({**r, "per_prompt": measured[r["drafter"]][0],
                     "same_as_greedy": measured[r["drafter"]][1]})  # fmt: skip
    for r in rows:
        m, lo, hi = mean_ci(r["per_prompt"])
        r.update(acceptance=m, ci_low=lo, ci_high=hi)

    table = {
        "size": args.size,
        "device": args.device,
        "eval_prompts": len(eval_rows),
        "data": data_stats,
        "recipe": {k: s[k] for k in ("block", "anchors", "max_length", "drafter_layers", "lr",
                                     "ours_batch", "sf_batch")}
        | {"warmup": WARMUP, "clip": CLIP, "gamma": gamma_for(s["block"])},
        "rows": rows,
        "elapsed_s": time.time() - started,
    }  # fmt: skip
    print_table(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    if tmp:
        tmp.cleanup()


def print_table(t):
    def num(x, p):
        return "–" if x is None else f"{x:.{p}f}"

    name = lambda r: r["trainer"] + (  # noqa: E731
        f" ({r['anchor_budget']})" if r["trainer"] == "dflash-top" else ""
    )
    print(
        f"\nacceptance length in dflash {t['size']} size, {t['eval_prompts']} held-out prompts "
        f"({t['device']}); recipe {t['recipe']}"
    )
    head = f"{'row':<13} {'trainer':<22} {'target tok':>10} {'wall s':>8} {'accept':>7} "
    head += f"{'95% CI':>15} {'trainer tau':>11}"
    print(head)
    print("-" * len(head))
    for r in t["rows"]:
        ci = f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        same = " (same run)" if r.get("same_run_as") else ""
        print(
            f"{r['row']:<13} {name(r):<22} {r['target_tokens']:>10} {r['wall_s']:>8.1f} "
            f"{r['acceptance']:>7.3f} {ci:>15} {num(r.get('tau'), 3):>11}{same}"
        )
    d = t["data"]
    print(
        f"data: {d['train_conversations']} training conversations, {d['train_tokens']} tokens "
        f"({d['train_supervised_tokens']} with loss); the target's replies follow its language "
        f"on {d['rule_follow']:.1%} of their tokens and {d['replies_ended_at_stop_word']}/"
        f"{d['target_replies']} end at their stop word"
    )
    print(f"elapsed {t['elapsed_s']:.0f}s")


if __name__ == "__main__":
    main()
