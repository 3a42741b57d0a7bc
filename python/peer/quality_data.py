"""The synthetic side of python/peer/quality.py: a small chat target trained on chat_lang.py's
language (1) and its own greedy replies, turn by turn, as checked training and held-out data (2).
A stage whose output is in its directory for the same settings is reused (`quality-stage.json`).
"""

import hashlib
import json
import os
import random
import re
import subprocess
import time

import chat_lang as cl
from quality_runs import digest, log
from quality_sizes import SIZES

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


def generate_sharded(work, name, binary, target, lines, max_new, device, procs, batch=None):
    """The target's greedy replies to the prompts in `lines` (JSONL), in their order, by
    `dflash-top generate` processes side by side (one prompt at a time is launch-bound on a
    GPU, so several processes fill it): `procs` contiguous shares at once; or, with `batch`,
    shards of `batch` prompts decoded together (`--batch`), `procs` of them at a time."""
    size = batch or max(1, -(-len(lines) // max(1, min(procs, len(lines)))))
    shards = [lines[i : i + size] for i in range(0, len(lines), size)]
    rows, running = [], []
    for k, shard in enumerate(shards):
        prompts = os.path.join(work, f"{name}-{k}-prompts.jsonl")
        out = os.path.join(work, f"{name}-{k}-greedy.jsonl")
        with open(prompts, "w") as f:
            f.writelines(shard)
        cmd = [
            binary, "generate", "--target", target, "--data", prompts, "--out", out,
            "--max-new-tokens", str(max_new), "--device", device,
        ] + (["--batch", str(batch)] if batch else [])  # fmt: skip
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        running.append((cmd, p, out, len(shard)))
        if len(running) < procs and k < len(shards) - 1:
            continue
        for cmd, p, out, n in running:
            err = p.communicate()[1]
            if p.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
            got = [json.loads(x) for x in open(out) if x.strip()]
            if len(got) != n:
                raise SystemExit(f"{out}: {len(got)} lines for {n} prompts")
            rows += got
        running = []
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


def write_train(d, s, tokenizer, train_msgs):
    """train.jsonl from the training conversations through SpecForge's chat parser, with a
    qwen-style ChatTemplate (as its `qwen` template, with our system prompt): loss on each
    assistant turn as rendered, `<|im_end|>\n` included. (kept, dropped, tokens, supervised)."""
    from specforge.data.loss_mask import has_consecutive_supervised_tokens
    from specforge.data.parse import GeneralParser
    from specforge.data.template import ChatTemplate

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
    return kept, dropped, tokens, supervised


def write_eval(d, s, tokenizer, eval_msgs, eval_last, train_prompts, train_replies):
    """eval.jsonl: the first `eval_convs` held-out conversations that repeat no training prompt
    or reply (the rest dropped and counted), as prompt + the target's last reply. (prompts,
    replies, dropped); fails with a sentence where too few are left."""
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
    return eval_prompts, eval_replies, leaked


def make_data(work, size, binary, target_dir, tokenizer, lang, gen_device, procs=1):
    """train.jsonl (input_ids + loss_mask, for dflash-top; SpecForge reads the same lines) and
    eval.jsonl (prompt + the target's reply of the last turn)."""
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

    kept, dropped, tokens, supervised = write_train(d, s, tokenizer, train_msgs)
    train_prompts = {
        cl.render(tokenizer, m[: j + 1], True)
        for m in train_msgs
        for j in range(1, len(m))
        if m[j]["role"] == "user"
    }
    train_replies = set(train_texts)
    eval_prompts, eval_replies, leaked = write_eval(
        d, s, tokenizer, eval_msgs, eval_last, train_prompts, train_replies
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
