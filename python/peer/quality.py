"""Acceptance side by side, one command: a drafter trained by dflash-top against one trained by
SpecForge 0.2.0's own DFlash trainer at its defaults, both measured with z-lab dflash 0.1.0's
speculative decoding on held-out prompts.

    .venv/bin/python python/peer/quality.py --size ci [--json OUT]        # the CI rows, 2 cores
    .venv/bin/python python/peer/quality.py --size ci --sweep --work W    # + both trainers' grids
    python python/peer/quality.py --size gpu --device cuda --work W --until tokens
    python python/peer/quality.py --size gpu --device cuda --work W --json OUT [--sweep]
    python python/peer/quality.py --size gpu --device cuda --target-dir HF_DIR --curve 8 ...

The GPU size needs torch, transformers, the `dflash` and `specforge` packages (PYTHONPATH will
do) and pydantic (SpecForge's chat parser imports it), and the release binary (--bin, default
target/release/dflash-top). It runs in parts with one --work directory: what is there for the
same settings is reused (the target, the data, each training run).

1. A small Qwen3 target learns the chat language of chat_lang.py (topics read from the latest
   user turn, replies that start at the user's seed word, of several lengths, that end with
   `<|im_end|>`; multi-turn conversations rendered through a ChatML template), trained here with
   transformers; saved as a Hugging Face directory with its tokenizer.json and chat template.
2. The target writes its own greedy replies, turn by turn (`dflash-top generate`, which renders
   the chat template; --gen-procs processes at once, 8 on a GPU); SpecForge's chat parser
   (`GeneralParser`, its `qwen`-style template) turns each conversation into `input_ids` +
   `loss_mask` (the assistant turns as rendered). Held-out conversations ask for (topic, seed)
   pairs no training conversation asks for, and give the evaluation prompts (their last turn).
   The replies are checked (first word, length bucket, the topic's map, the stop word; distinct
   replies counted; held-out prompts and replies not in training) and the run fails where they
   do not hold (check_data).
3. For each seed (3), a random DFlashDraftModel init (z-lab dflash's class); both trainers start
   from it and train on the same conversations in the same order, with the same recipe numbers
   (4% warm-up, cosine, clip 1.0, gamma 7 for block 16), for the same number of target tokens:
   dflash-top at the size's recipe (`ours`), SpecForge at its default batch of one conversation
   a step (`sf`). Then the faster of the two trains again (a fresh run) for as many tokens as
   match the slower one's time after its first optimizer step (warm-up and compilation out, for
   both). Both are pinned to the same cores (--cores); the target's hidden states come from one
   forward over each step's batch for both. With --sweep, each trainer also runs its grid of
   step size (SpecForge's batch; our --seq-len with --anchors) and lr, at equal tokens.
4. Each drafter (and the untrained init, as a floor) drafts for the target in
   `dflash.model.dflash_generate` (greedy) on the held-out prompts: acceptance length per prompt
   (tokens per round); per row the mean and 95% interval over (seed, prompt), and the paired
   difference ours minus SpecForge over the same (seed, prompt) pairs.
5. Prints the table and writes it as JSON (--json); with --curve K, learning curves (acceptance
   against target tokens and against seconds after the first step) that plot_curves.py draws.

With --target-dir, steps 1-2 are quality_real.py's instead: a prepared Hugging Face target,
prompts of real text (real_prompts.py), its own greedy replies by `dflash-top generate --batch`.

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
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import chat_lang as cl  # noqa: E402
import quality_measure as qm  # noqa: E402
import quality_real as qr  # noqa: E402
from quality_runs import (  # noqa: E402
    WARMUP, CLIP, digest, gamma_for, label, log, make_init, match_wall, run_many, run_ours,
    run_specforge,
)  # fmt: skip

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
            # 100 steps learnt the topics' maps but not to start at the user's seed word (10 of
            # 165 replies did, 7 distinct replies); at 300 every reply of a sample of 30 did.
            "steps": 300,
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
        "held_share": 0.2,
        "drafter_layers": 2,
        "block": 16,
        # SpecForge's anchors per conversation (its num_anchors).
        "anchors": 64,
        # Three optimizer steps a packed row of 256 tokens: about one conversation (87 tokens)
        # a step, as SpecForge's batch 1 takes (docs/quality.md: 1 step a row learnt less per
        # token than SpecForge at batch 1; 3 learnt more).
        "ours": {"seq_len": 256, "anchors": 64, "budget": "per-row", "steps_per_batch": 3,
                 "lr": 3e-3},
        # SpecForge 0.2.0's default batch: one conversation a step.
        "sf": {"batch": 1, "lr": 3e-3},
        "sweep": {
            "ours": {"step": [{"steps_per_batch": 1}, {"steps_per_batch": 3},
                              {"steps_per_batch": 6}, {"seq_len": 128, "anchors": 32}],
                     "lr": [1e-3, 3e-3, 1e-2]},
            "sf": {"step": [{"batch": 1}, {"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3, 1e-2]},
        },
        "seeds": 3,
        "tokens": 48 * 256,
        "eval_max_new": 128,
        "floor_prompts": 16,
        "threads": 1,
        # --target-dir: prompts of real text (real_prompts.py) and the target's replies.
        "real": {"train_prompts": 64, "eval_prompts": 16, "max_new": 48},
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
        "train_convs": 480,
        "eval_convs": 128,
        "held_share": 0.2,
        "drafter_layers": 5,
        "block": 16,
        "anchors": 512,
        "ours": {"seq_len": 3072, "anchors": 512, "budget": "per-row", "steps_per_batch": 4,
                 "lr": 6e-4},
        "sf": {"batch": 1, "lr": 6e-4},
        "sweep": {
            "ours": {"step": [{"steps_per_batch": 1}, {"steps_per_batch": 4},
                              {"steps_per_batch": 8}],
                     "lr": [1e-3, 3e-3, 1e-2]},
            "sf": {"step": [{"batch": 1}, {"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3, 1e-2]},
        },
        "seeds": 3,
        # 32 steps: training still going on. At 600 steps (1.84M tokens) every trainer reaches the
        # data's ceiling (docs/quality.md) and the table can no longer tell them apart.
        "tokens": 32 * 3072,
        "eval_max_new": 384,
        "floor_prompts": 8,
        "threads": None,
        # --target-dir (SmolLM2-135M-Instruct, docs/quality.md): docstring prompts of ~100-300
        # tokens and replies up to 512; the keys after max_new replace the size's own.
        # 640 prompts make about 290K target tokens; 128 rows of 1,024 (131K tokens) are about
        # half an epoch, and SpecForge at batch 1 trains them in about a minute a seed on one GPU
        # (the whole run, sweep and curves included, fits one session's 30 device minutes).
        "real": {"train_prompts": 640, "eval_prompts": 128, "max_new": 512,
                 "tokens": 128 * 1024,
                 "eval_max_new": 128,
                 # SpecForge's batch of one conversation (~450 tokens, ~250 labelled) takes up
                 # to 512 anchors of it: one anchor per two tokens or so, a step per ~450 tokens.
                 # Ours at its default (rows of 3,072, 512 anchors, one step a row) takes one per
                 # six, a step per 3,072. Rows of 1,024 with 512 anchors in two steps come
                 # closest to SpecForge's step (the default is a sweep row).
                 "ours": {"seq_len": 1024, "anchors": 512, "budget": "per-row",
                          "steps_per_batch": 2, "lr": 6e-4},
                 # One change at a time from each primary setting (not the whole grid: a GPU
                 # call's minutes), every row shown.
                 "sweep": {
                     "cross": True,
                     "ours": {"step": [{"steps_per_batch": 1}, {"steps_per_batch": 4},
                                       {"seq_len": 3072, "steps_per_batch": 1},
                                       {"seq_len": 3072, "steps_per_batch": 6}],
                              "lr": [1e-3, 3e-3]},
                     "sf": {"step": [{"batch": 2}, {"batch": 4}], "lr": [1e-3, 3e-3]},
                 }},
    },
}
# The keys of SIZES[size]["real"] that replace the size's own with --target-dir.
REAL_OVERRIDES = ("tokens", "eval_max_new", "ours", "sf", "sweep")
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
    stats = {"replies": 0, "ended": 0, "rule_ok": 0, "rule_n": 0, "stop_ok": 0, "first_ok": 0,
             "length_ok": 0, "words": 0, "bucket_mid": 0}
    texts = []
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
            k, seed, bucket = convs[i][turn]
            nums = [int(x[1:]) for x in words if re.fullmatch(r"w\d+", x)]
            ok, tot, stop = lang.follows(k, nums)
            got = lang.check_reply(k, seed, bucket, nums)
            stats["replies"] += 1
            stats["ended"] += ended
            stats["rule_ok"] += ok
            stats["rule_n"] += tot
            stats["stop_ok"] += stop and ended and len(nums) == len(words)
            stats["first_ok"] += got["first"] and len(nums) == len(words)
            stats["length_ok"] += got["length"] and ended
            stats["words"] += len(words)
            stats["bucket_mid"] += (bucket[0] + bucket[1]) / 2
            texts.append(" ".join(words))
    return msgs, last, stats, texts


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
                                    "train_convs", "eval_convs", "held_share")}
                 | {"target": target_id, "v": 3})
    if cached(d, key):
        log(f"data: reusing {d}")
        with open(os.path.join(d, "quality-stage.json")) as f:
            return d, key, json.load(f)["stats"]
    t0 = time.time()
    rng = random.Random(12345)
    # Held-out conversations ask for (topic, seed) pairs that no training conversation asks for.
    train_pool, held_pool = cl.split_pairs(lang, s["buckets"], s["held_share"], 54321)

    def conversations(n, pool):
        out = []
        while len(out) < n:
            turns = cl.sample_turns(rng, lang, s["buckets"], s["max_turns"], s["budget"], pool)
            if turns:
                out.append(turns)
        return out

    train_convs = conversations(s["train_convs"], train_pool)
    # A quarter more held-out conversations than kept: one whose reply the target wrote as it
    # wrote a training one (where it missed the seed word) is dropped, and counted.
    eval_convs = conversations(s["eval_convs"] * 5 // 4, held_pool)
    max_new = max(hi for _, hi in s["buckets"]) + 8
    train_msgs, _, st_train, train_texts = generate_turns(
        d, "train", binary, target_dir, tokenizer, lang, train_convs, max_new, gen_device, True,
        procs,
    )  # fmt: skip
    eval_msgs, eval_last, st_eval, eval_texts = generate_turns(
        d, "eval", binary, target_dir, tokenizer, lang, eval_convs, max_new, gen_device, False,
        procs,
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
    train_prompts = {
        cl.render(tokenizer, m[: j + 1], True)
        for m in train_msgs
        for j in range(1, len(m))
        if m[j]["role"] == "user"
    }
    train_replies = set(train_texts)
    eval_prompts, eval_replies, leaked = [], [], 0
    with open(os.path.join(d, "eval.jsonl"), "w") as f:
        for m, reply in zip(eval_msgs, eval_last):
            text = cl.render(tokenizer, m[:-1], True)
            said = [x["content"] for x in m if x["role"] == "assistant"]
            if text in train_prompts or any(x in train_replies for x in said):
                leaked += 1
                continue
            if len(eval_prompts) == s["eval_convs"]:
                continue
            eval_prompts.append(text)
            eval_replies += said
            prompt = cl.encode(tokenizer, text)
            f.write(json.dumps({"prompt": prompt, "reply": reply}) + "\n")
    if len(eval_prompts) < s["eval_convs"]:
        raise SystemExit(
            f"{leaked} of {len(eval_msgs)} held-out conversations repeat a training reply, "
            f"{len(eval_prompts)} are left of the {s['eval_convs']} wanted: the target misses "
            "the seed word too often; train it longer (--target-steps)"
        )
    both = {k: st_train[k] + st_eval[k] for k in st_train}
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
        "replies_first_word_is_seed": both["first_ok"],
        "replies_length_in_bucket": both["length_ok"],
        "reply_words_mean": both["words"] / max(1, both["replies"]),
        "reply_words_asked_mean": both["bucket_mid"] / max(1, both["replies"]),
        "distinct_train_replies": len(set(train_texts)),
        "distinct_eval_replies": len(set(eval_texts)),
        "eval_dropped_as_in_train": leaked,
        "eval_replies_in_train": len(set(eval_replies) & train_replies),
        "eval_prompts_in_train": len(set(eval_prompts) & train_prompts),
        "gen_s": time.time() - t0,
    }
    mark(d, key, {"stats": stats})
    log(f"data: {json.dumps(stats)}")
    return d, key, stats


def check_data(d, share=0.95):
    """Fails the run, with a sentence, where the target's replies do not follow the language (a
    `share` of the replies start with the user's seed word, have a length in the bucket asked
    for and follow the topic's map) or the held-out set repeats training."""
    n = d["target_replies"]
    for key, what in [
        ("replies_first_word_is_seed", "start with the user's seed word"),
        ("replies_length_in_bucket", "have a length in the bucket asked for"),
        ("replies_ended_at_stop_word", "end right after their topic's stop word"),
    ]:
        if d[key] < share * n:
            raise SystemExit(
                f"{d[key]} of the target's {n} replies {what} (at least {share:.0%} must): "
                "train the target longer (--target-steps)"
            )
    if d["rule_follow"] < share:
        raise SystemExit(
            f"the target follows its language on {d['rule_follow']:.0%} of its reply tokens only "
            f"(at least {share:.0%} must): train the target longer (--target-steps)"
        )
    if d["eval_replies_in_train"] or d["eval_prompts_in_train"]:
        raise SystemExit(
            f"{d['eval_prompts_in_train']} held-out prompts and {d['eval_replies_in_train']} "
            "held-out replies are in the training data: the held-out split leaks"
        )


# ---------------------------------------------------------------------------------------------
# 3. The shared init and the two trainers


# ---------------------------------------------------------------------------------------------
# 4. Acceptance in dflash


# (quality_measure.py)


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


def settings(s, trainer, args):
    """The settings a trainer runs: its primary one, and with --sweep every one of its grid."""
    key = "ours" if trainer == "dflash-top" else "sf"
    primary = dict(s[key])
    if key == "ours":
        for name in ("seq_len", "anchors", "budget", "steps_per_batch", "lr"):
            if getattr(args, f"ours_{name}") is not None:
                primary[name] = getattr(args, f"ours_{name}")
    out = [("primary", primary)]
    if args.sweep:
        grid = s["sweep"][key]
        if s["sweep"].get("cross"):  # one change at a time from the primary setting
            ones = [{**primary, **step} for step in grid["step"]]
            ones += [{**primary, "lr": lr} for lr in grid["lr"]]
        else:
            ones = [{**primary, **step, "lr": lr} for step in grid["step"] for lr in grid["lr"]]
        for one in ones:
            if one != primary and ("sweep", one) not in out:
                out.append(("sweep", one))
    return out


def mask_id_of(tokenizer, vocab_size):
    """The mask token of a prepared target, as SpecForge looks for one: an added token named
    like `<|mask|>`; else the first id the tokenizer leaves free in the embedding table; else
    (a table the tokenizer fills) its unk, pad or eos token, which the data rarely holds."""
    for tok, i in tokenizer.get_added_vocab().items():
        if tok.strip("<|>[]_ ").lower() == "mask":
            return i
    if len(tokenizer) < vocab_size:
        return len(tokenizer)
    for i in (tokenizer.unk_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id):
        if i is not None:
            return i
    raise SystemExit("the target's tokenizer has no mask, unk, pad or eos token and no free id: "
                     "give --mask-token-id")  # fmt: skip


def pin(cores):
    """Pins this process (SpecForge's runs) and its children (dflash-top's) to `cores`."""
    if cores is None:
        return None
    want = {int(c) for c in cores.split(",")}
    have = os.sched_getaffinity(0)
    if not want <= have:
        raise SystemExit(f"--cores {cores}: this process may run on cores {sorted(have)} only")
    os.sched_setaffinity(0, want)
    return sorted(want)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="ci")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", help="write the table as JSON here")
    ap.add_argument("--work", help="working directory (kept; stages reused); default: a temp dir")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/dflash-top"))
    ap.add_argument("--tokens", type=int, help="target tokens of the equal-tokens runs")
    ap.add_argument("--target-steps", type=int, help="training steps of the target")
    ap.add_argument("--seeds", type=int, help="seeds (init and training) of each row (size's: 3)")
    ap.add_argument("--sweep", action="store_true",
                    help="also each trainer's grid of step size and lr, at equal tokens")
    ap.add_argument("--curve-seeds", type=int, default=1 << 30, metavar="N",
                    help="learning curves for the first N seeds only (all)")
    ap.add_argument("--sweep-seeds", type=int, default=1, help="seeds of each sweep row (1)")
    ap.add_argument("--sweep-procs", type=int, default=1, metavar="N",
                    help="sweep runs side by side (1; their seconds are then not a pace)")
    ap.add_argument("--no-wall", action="store_true", help="skip the equal-wall rows")
    ap.add_argument("--wall-seeds", type=int, default=1 << 30, metavar="N",
                    help="equal-wall rows for the first N seeds only (all)")
    ap.add_argument("--curve", type=int, default=1, metavar="K",
                    help="learning curves: K points along each equal-tokens primary run, each "
                    "measured in dflash (the JSON's `curves`; plot_curves.py draws them)")
    ap.add_argument("--ours-seq-len", type=int, help="dflash-top's --seq-len (size's)")
    ap.add_argument("--ours-anchors", type=int, help="dflash-top's --anchors (size's)")
    ap.add_argument("--ours-budget", choices=["per-row", "per-doc"],
                    help="dflash-top's --anchor-budget (size's)")
    ap.add_argument("--ours-lr", type=float, help="dflash-top's --lr (size's)")
    ap.add_argument("--ours-steps-per-batch", type=int,
                    help="dflash-top's --steps-per-batch (size's)")
    ap.add_argument("--cores", help="pin both trainers to these cores, e.g. `0` (CPU size: the "
                    "first --threads cores this process may use)")  # fmt: skip
    ap.add_argument("--threads", type=int, help="torch intra-op threads of the Python stages")
    ap.add_argument("--target-dir", help="a prepared Hugging Face target (tokenizer with a chat "
                    "template) instead of training the synthetic one; prompts of real text "
                    "(real_prompts.py), replies by `dflash-top generate --batch`")
    ap.add_argument("--gen-batch", type=int,
                    help="--target-dir: prompts `dflash-top generate` decodes together (64 on "
                    "cuda, 16 on cpu)")
    ap.add_argument("--mask-token-id", type=int,
                    help="--target-dir: the drafter's mask token (default: an added mask token, "
                    "else the first id the tokenizer leaves free, else its unk/pad token)")
    ap.add_argument(
        "--until", choices=["target", "data", "tokens"], help="stop after this stage"
    )
    ap.add_argument(
        "--measure-procs",
        type=int,
        help="processes measuring acceptance side by side, each with its own target (8 on "
        "cuda, 1 on cpu)",
    )
    ap.add_argument(
        "--gen-procs",
        type=int,
        help="concurrent `dflash-top generate` processes for the data (8 on cuda, 1 on cpu)",
    )
    args = ap.parse_args()

    s = SIZES[args.size]
    if args.target_dir:
        s = {**s, **{k: v for k, v in s["real"].items() if k in REAL_OVERRIDES}}
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    threads = args.threads or s["threads"]
    if threads:
        torch.set_num_threads(threads)
    if args.cores is None and threads and args.device == "cpu":
        args.cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    if not os.access(args.bin, os.X_OK):
        raise SystemExit(f"{args.bin} is not an executable: build it (cargo build --release)")
    with open(args.bin, "rb") as f:
        bin_id = hashlib.sha256(f.read()).hexdigest()[:16]
    gen_procs = args.gen_procs or (8 if args.device == "cuda" else 1)
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

    gen_device = "cuda:0" if args.device == "cuda" else "cpu"
    if args.target_dir:
        # A prepared target: prompts of real text, its own greedy replies.
        from transformers import AutoConfig, AutoTokenizer

        target_dir = args.target_dir
        if not os.path.isfile(os.path.join(target_dir, "config.json")):
            raise SystemExit(f"--target-dir {target_dir}: no config.json there; give a Hugging "
                             "Face model directory (tools/ can make one from a GGUF)")  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        if not tokenizer.chat_template:
            raise SystemExit(f"--target-dir {target_dir}: its tokenizer has no chat template; "
                             "give an instruction-tuned model's directory")  # fmt: skip
        data_dir, data_key, data_stats = qr.make_real_data(
            work, s, args.bin, target_dir, tokenizer, gen_device,
            args.gen_batch or (64 if args.device == "cuda" else 16), gen_procs,
        )
        print_data(data_stats)
        if args.until == "data":
            return
        qr.check_real_data(data_stats)
        mask_id = args.mask_token_id
        if mask_id is None:
            mask_id = mask_id_of(tokenizer, AutoConfig.from_pretrained(target_dir).vocab_size)
    else:
        lang = cl.Lang(**s["lang"])
        target_dir, tokenizer = make_target(work, args.size, lang, device, args.target_steps)
        if args.until == "target":
            return
        data_dir, data_key, data_stats = make_data(
            work, args.size, args.bin, target_dir, tokenizer, lang, gen_device, gen_procs
        )
        print_data(data_stats)
        if args.until == "data":
            return
        check_data(data_stats)
        mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    train_jsonl = os.path.join(data_dir, "train.jsonl")
    samples = [
        (r["input_ids"], r["loss_mask"]) for r in map(json.loads, open(train_jsonl)) if r
    ]
    eval_rows = [json.loads(x) for x in open(os.path.join(data_dir, "eval.jsonl")) if x.strip()]
    cores = pin(args.cores)
    seeds = list(range(args.seeds or s["seeds"]))
    sweep_seeds = seeds[: max(1, args.sweep_seeds)]
    ctx = {
        "s": s, "work": work, "device": args.device, "bin": args.bin, "bin_id": bin_id,
        "reuse": args.work is not None, "target_dir": target_dir, "train_jsonl": train_jsonl,
        "samples": samples, "init": {}, "mask_id": None,
        # (each run's key adds its setting; the cores are not in it: a run's tokens and
        # acceptance do not depend on them)
        "key": digest([data_key, {k: v for k, v in s.items()
                                  if k not in ("threads", "sweep", "ours", "sf", "real")}]),
    }  # fmt: skip
    for seed in seeds:
        ctx["init"][seed] = make_init(work, s, target_dir, mask_id, seed)
    ctx["mask_id"] = mask_id
    tokens = args.tokens or s["tokens"]
    ours_set, sf_set = settings(s, "dflash-top", args), settings(s, "specforge", args)

    def ours(name, setting, seed, n):
        return run_ours(ctx, f"ours-{name}-s{seed}", setting, seed, n)

    def sf(name, setting, seed, n):
        return run_specforge(ctx, f"sf-{name}-s{seed}", setting, seed, n)

    # Equal target tokens, primary settings, every seed; SpecForge reads as many tokens as ours.
    runs = []
    for seed in seeds:
        points = args.curve if seed < args.curve_seeds else 1
        o = run_ours(ctx, f"ours-tokens-s{seed}", ours_set[0][1], seed, tokens, points)
        f = run_specforge(ctx, f"sf-tokens-s{seed}", sf_set[0][1], seed, o["target_tokens"],
                          points)  # fmt: skip
        runs += [{**o, "row": "equal tokens"}, {**f, "row": "equal tokens"}]
    if args.until == "tokens":
        return
    # Equal wall time (first optimizer step excluded, for both): the faster trainer trains again,
    # a fresh run on its own schedule, for the tokens its pace gives in the slower one's time.
    if not args.no_wall:
        for seed in seeds[: args.wall_seeds]:
            o, f = (next(r for r in runs if r["seed"] == seed and r["trainer"] == t)
                    for t in ("dflash-top", "specforge"))  # fmt: skip
            if o["warm_s"] <= f["warm_s"]:
                r = match_wall(o, f["warm_s"], lambda n, i, seed=seed: ours(
                    f"wall{i}", ours_set[0][1], seed, n))  # fmt: skip
                runs += [{**r, "row": "equal wall"}, {**f, "row": "equal wall", "same_run": True}]
            else:
                r = match_wall(f, o["warm_s"], lambda n, i, seed=seed: sf(
                    f"wall{i}", sf_set[0][1], seed, n))  # fmt: skip
                runs += [{**o, "row": "equal wall", "same_run": True}, {**r, "row": "equal wall"}]
    # The sweep, at equal tokens: each setting of each trainer's grid (--sweep-procs side by
    # side: the sweep's rows compare tokens, not seconds).
    jobs = [(trainer, f"{pre}-sweep{i}-s{seed}", setting, seed, tokens)
            for trainer, pre, sets in [("dflash-top", "ours", ours_set), ("specforge", "sf", sf_set)]
            for i, (kind, setting) in enumerate(sets) if kind == "sweep"
            for seed in sweep_seeds]  # fmt: skip
    runs += [{**r, "row": "sweep"} for r in run_many(ctx, jobs, args.sweep_procs)]
    for trainer in ("dflash-top", "specforge"):
        if args.sweep:  # the primary setting's rows join the sweep, for its best-of
            runs += [{**r, "row": "sweep"} for r in runs
                     if r["row"] == "equal tokens" and r["trainer"] == trainer
                     and r["seed"] in sweep_seeds]  # fmt: skip

    # Acceptance in dflash: every drafter, the curves' checkpoints too, in one pass.
    jobs = [(ctx["init"][0], eval_rows[: s["floor_prompts"]])]
    jobs += [(r["drafter"], eval_rows) for r in runs]
    if args.curve > 1:
        jobs += [(c[3], eval_rows) for r in runs if r["row"] == "equal tokens" for c in r["curve"]]
    measure_procs = args.measure_procs or (8 if args.device == "cuda" else 1)
    measured = qm.measure_all(jobs, target_dir, gen_device, dtype, s["eval_max_new"],
                              measure_procs)  # fmt: skip
    for r in runs:
        r["per_prompt"], r["same_as_greedy"] = measured[r["drafter"]]
    curves = []
    if args.curve > 1:
        for r in runs:
            if r["row"] != "equal tokens" or len(r["curve"]) < 2:
                continue
            pts = []
            for step, x, sec, d in r["curve"]:
                per = measured[d][0]
                pts.append({"step": step, "target_tokens": x, "seconds": sec,
                            "acceptance": sum(per) / len(per)})
            curves.append({"trainer": r["trainer"], "label": label(r["trainer"], r["setting"]),
                           "seed": r["seed"], "points": pts})  # fmt: skip
            log(f"curve {r['trainer']} seed {r['seed']}: "
                + " ".join(f"{p['target_tokens']}:{p['acceptance']:.2f}" for p in pts))
    rows = [{"trainer": "untrained init", "row": "floor", "label": "seed 0", "seeds": [0],
             "target_tokens": 0, "wall_s": 0.0, "warm_s": 0.0,
             "per_prompt": measured[ctx["init"][0]][0]}]  # fmt: skip
    rows += group(runs)
    for r in rows:
        m, lo, hi = mean_ci(r.get("pooled", r["per_prompt"]))
        r.update(acceptance=m, ci_low=lo, ci_high=hi)

    table = {
        "size": args.size,
        "device": args.device,
        "cores": cores,
        "eval_prompts": len(eval_rows),
        "seeds": seeds,
        "data": data_stats,
        "recipe": {k: s[k] for k in ("block", "anchors", "max_length", "drafter_layers")}
        | {"ours": ours_set[0][1], "specforge": sf_set[0][1], "warmup": WARMUP, "clip": CLIP,
           "gamma": gamma_for(s["block"])},
        "rows": rows,
        "paired": paired(rows),
        "curves": curves,
        "runs": [{k: v for k, v in r.items() if k != "trace"} for r in runs],
        "elapsed_s": time.time() - started,
    }  # fmt: skip
    print_table(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    if tmp:
        tmp.cleanup()


def group(runs):
    """One table row per (row, trainer, setting): its seeds' runs, acceptance pooled over
    (seed, prompt), and per prompt the mean over seeds."""
    out = {}
    for r in runs:
        k = (r["row"], r["trainer"], label(r["trainer"], r["setting"]))
        out.setdefault(k, []).append(r)
    rows = []
    for (row, trainer, lab), rs in out.items():
        rs = sorted(rs, key=lambda r: r["seed"])
        n = len(rs)
        per_seed = [r["per_prompt"] for r in rs]
        rows.append({
            "row": row,
            "trainer": trainer,
            "label": lab,
            "setting": rs[0]["setting"],
            "seeds": [r["seed"] for r in rs],
            "steps": sum(r["steps"] for r in rs) / n,
            "target_tokens": sum(r["target_tokens"] for r in rs) / n,
            "wall_s": sum(r["wall_s"] for r in rs) / n,
            "warm_s": sum(r["warm_s"] for r in rs) / n,
            "tau": None if trainer != "dflash-top" else sum(r["tau"] or 0 for r in rs) / n,
            "same_run": bool(rs[0].get("same_run")),
            "per_seed": per_seed,
            "per_prompt": [sum(x) / n for x in zip(*per_seed)],
            "pooled": [x for p in per_seed for x in p],
            "same_as_greedy": min(r["same_as_greedy"] for r in rs),
        })  # fmt: skip
    return rows


def paired(rows):
    """Paired differences over (seed, prompt), ours minus SpecForge: per row kind, the primary
    settings; for the sweep, each trainer's best setting (highest mean) against the other's."""
    out = []

    def diff(row, a, b):
        common = [s for s in a["seeds"] if s in b["seeds"]]
        d = [x - y for s in common
             for x, y in zip(a["per_seed"][a["seeds"].index(s)],
                             b["per_seed"][b["seeds"].index(s)])]  # fmt: skip
        m, lo, hi = mean_ci(d)
        out.append({"row": row, "ours": a["label"], "specforge": b["label"], "seeds": common,
                    "n": len(d), "mean": m, "ci_low": lo, "ci_high": hi})  # fmt: skip

    for row in ("equal tokens", "equal wall"):
        rs = [r for r in rows if r["row"] == row]
        o = [r for r in rs if r["trainer"] == "dflash-top"]
        f = [r for r in rs if r["trainer"] == "specforge"]
        if o and f:
            diff(row, o[0], f[0])
    sw = [r for r in rows if r["row"] == "sweep"]
    best = {}
    for r in sw:
        m = sum(r["pooled"]) / len(r["pooled"])
        if r["trainer"] not in best or m > best[r["trainer"]][0]:
            best[r["trainer"]] = (m, r)
    if len(best) == 2:
        diff("sweep best", best["dflash-top"][1], best["specforge"][1])
    return out


def print_data(d):
    if "replies_first_word_is_seed" not in d:  # a prepared target's data (quality_real.py)
        print(f"data: {json.dumps(d)}", flush=True)
        return
    print(
        f"data: {d['train_conversations']} training conversations, {d['train_tokens']} tokens "
        f"({d['train_supervised_tokens']} with loss); of the target's {d['target_replies']} "
        f"replies {d['replies_first_word_is_seed']} start with the user's seed word, "
        f"{d['replies_length_in_bucket']} have a length in the bucket asked for (mean "
        f"{d['reply_words_mean']:.1f} words, asked {d['reply_words_asked_mean']:.1f}), "
        f"{d['replies_ended_at_stop_word']} end at their stop word, {d['rule_follow']:.1%} of "
        f"reply tokens follow the topic's map; distinct replies: {d['distinct_train_replies']} "
        f"training, {d['distinct_eval_replies']} held-out; held-out in training: "
        f"{d['eval_prompts_in_train']} prompts, {d['eval_replies_in_train']} replies "
        f"({d['eval_dropped_as_in_train']} held-out conversations dropped as repeating training)",
        flush=True,
    )


def print_table(t):
    def num(x, p):
        return "–" if x is None else f"{x:.{p}f}"

    print(
        f"\nacceptance length in dflash, {t['size']} size, {t['eval_prompts']} held-out prompts "
        f"x seeds {t['seeds']} ({t['device']}, cores {t['cores']}); block {t['recipe']['block']}"
    )
    head = f"{'row':<13} {'trainer':<11} {'setting':<30} {'steps':>6} {'target tok':>10} "
    head += f"{'wall s':>7} {'warm s':>7} {'accept':>7} {'95% CI':>15} {'tau':>6}"
    print(head)
    print("-" * len(head))
    for r in t["rows"]:
        ci = f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
        same = " (same run)" if r.get("same_run") else ""
        print(
            f"{r['row']:<13} {r['trainer']:<11} {r['label']:<30} {num(r.get('steps'), 0):>6} "
            f"{r['target_tokens']:>10.0f} {r['wall_s']:>7.1f} {r['warm_s']:>7.1f} "
            f"{r['acceptance']:>7.3f} {ci:>15} {num(r.get('tau'), 2):>6}{same}"
        )
    for p in t["paired"]:
        print(
            f"paired, {p['row']}: ours ({p['ours']}) - SpecForge ({p['specforge']}) = "
            f"{p['mean']:+.2f} [{p['ci_low']:+.2f}, {p['ci_high']:+.2f}] over {p['n']} "
            f"(seed, prompt) pairs"
        )
    print_data(t["data"])
    print(f"elapsed {t['elapsed_s']:.0f}s")


if __name__ == "__main__":
    main()
