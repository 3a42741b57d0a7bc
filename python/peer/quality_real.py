"""The data of python/peer/quality.py for a prepared target (--target-dir, a Hugging Face
directory with its tokenizer and chat template): prompts of real text (real_prompts.py), the
target's own greedy replies written by `dflash-top generate --batch`, held-out prompts from
modules no training prompt comes from; checked (replies that end, distinct replies, held-out
prompts and replies not in training) and counted.
"""

import hashlib
import json
import os
import sys
import time

import real_prompts
from quality_data import generate_sharded
from quality_runs import digest, log


def target_id(target_dir):
    """A digest of the target's config and the first MiB of each weight file (quick to take for
    a large model, and it changes when the weights do)."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(target_dir)):
        if name == "config.json" or name.endswith(".safetensors"):
            with open(os.path.join(target_dir, name), "rb") as f:
                h.update(name.encode() + f.read(1 << 20))
    return h.hexdigest()[:16]


def make_real_data(work, s, binary, target_dir, tokenizer, gen_device, batch, procs=1):
    """train.jsonl (input_ids + loss_mask) and eval.jsonl (prompt + reply) as make_data writes
    them, and the data's counts."""
    d = os.path.join(work, "data")
    os.makedirs(d, exist_ok=True)
    key = digest({"target": target_id(target_dir), "real": s["real"], "python": sys.version,
                  "batch": batch, "v": 3})  # fmt: skip
    stage = os.path.join(d, "quality-stage.json")
    try:
        with open(stage) as f:
            got = json.load(f)
        if got.get("key") == key:
            log(f"data: reusing {d}")
            return d, key, got["stats"]
    except OSError:
        pass
    t0 = time.time()
    r = s["real"]
    train_msgs, eval_msgs = real_prompts.prompts(r["train_prompts"], r["eval_prompts"])
    eos = set(tokenizer.all_special_ids) & {tokenizer.eos_token_id} | set(r.get("eos_ids", []))
    # Train and held-out prompts in one pass: shards of `batch` decoded together, `procs` of
    # them side by side (420 s for 768 replies in one process on an H200; 84 s in 12 on an H100).
    lines = [json.dumps({"messages": m}) + "\n" for m in train_msgs + eval_msgs]
    both = generate_sharded(d, "replies", binary, target_dir, lines, r["max_new"], gen_device,
                            procs, batch)  # fmt: skip
    train, held = both[: len(train_msgs)], both[len(train_msgs) :]

    def split(row):
        mask = row["loss_mask"]
        n = mask.index(1) if 1 in mask else len(mask)
        return row["input_ids"][:n], row["input_ids"][n:]

    kept = dropped = tokens = supervised = ended = reply_tokens = 0
    with open(os.path.join(d, "train.jsonl"), "w") as f:
        for row in train:
            if sum(row["loss_mask"]) < 2:
                dropped += 1
                continue
            kept += 1
            tokens += len(row["input_ids"])
            supervised += sum(row["loss_mask"])
            f.write(json.dumps({"input_ids": row["input_ids"], "loss_mask": row["loss_mask"]})
                    + "\n")  # fmt: skip
    replies = {"train": [], "eval": []}
    prompts = {"train": [], "eval": []}
    for part, rows in (("train", train), ("eval", held)):
        for row in rows:
            p, rep = split(row)
            prompts[part].append(tuple(p))
            replies[part].append(tuple(rep))
            ended += bool(rep) and rep[-1] in eos
            reply_tokens += len(rep)
    with open(os.path.join(d, "eval.jsonl"), "w") as f:
        for p, rep in zip(prompts["eval"], replies["eval"]):
            f.write(json.dumps({"prompt": list(p), "reply": list(rep)}) + "\n")
    n = len(train) + len(held)
    stats = {
        "source": "prompts: real_prompts.py (the Python standard library's docstrings, "
        f"Python {sys.version.split()[0]}, PSF-2.0)",
        "train_conversations": kept,
        "dropped_under_2_loss_tokens": dropped,
        "train_tokens": tokens,
        "train_supervised_tokens": supervised,
        "target_replies": n,
        "train_replies": len(train),
        "replies_ended": ended,
        "reply_tokens_mean": reply_tokens / max(1, n),
        "distinct_train_replies": len(set(replies["train"])),
        "distinct_eval_replies": len(set(replies["eval"])),
        "eval_replies_in_train": len(set(replies["eval"]) & set(replies["train"])),
        "eval_prompts_in_train": len(set(prompts["eval"]) & set(prompts["train"])),
        "gen_s": time.time() - t0,
    }
    with open(stage, "w") as f:
        json.dump({"key": key, "stats": stats}, f)
    log(f"data: {json.dumps(stats)}")
    return d, key, stats


def check_real_data(d, min_distinct=0.9):
    """Fails the run, with a sentence, where the held-out set repeats training or the target
    repeats itself (fewer than `min_distinct` of its replies distinct)."""
    if d["eval_replies_in_train"] or d["eval_prompts_in_train"]:
        raise SystemExit(
            f"{d['eval_prompts_in_train']} held-out prompts and {d['eval_replies_in_train']} "
            "held-out replies are in the training data: the held-out split leaks"
        )
    if d["distinct_train_replies"] < min_distinct * d["train_replies"]:
        raise SystemExit(
            f"only {d['distinct_train_replies']} of the target's training replies are distinct: "
            "the target repeats itself; check its chat template and weights (--target-dir)"
        )
