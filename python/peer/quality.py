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
   (4% warm-up, cosine, clip 1.0, gamma 7 for block 16), for the same number of target tokens
   (the data's: dflash-top's `doc_tokens`, the padding of its packed rows out):
   dflash-top at the size's recipe (`ours`), SpecForge at its default batch of one conversation
   a step (`sf`). Then the faster of the two trains again (a fresh run) for as many tokens as
   match the slower one's time after its first optimizer step (warm-up and compilation out, for
   both; each trainer's least time over the seeds, as the first run in a process can pay more
   than its first step). Both are pinned to the same cores (--cores); the target's hidden
   states come from one forward over each step's batch for both. With --sweep, each trainer
   also runs its grid of step size (SpecForge's batch; our --seq-len with --anchors) and lr, at
   equal tokens.
4. Each drafter (and the untrained init, as a floor) drafts for the target in
   `dflash.model.dflash_generate` (greedy) on the held-out prompts: acceptance length per prompt
   (tokens per round); per row the mean and 95% interval over (seed, prompt), and the paired
   difference ours minus SpecForge over the same (seed, prompt) pairs. On a GPU the rounds are
   replayed from one forward a prompt (quality_replay.py: the same rounds, hundreds of times
   faster); --check N measures N drafters both ways and the table keeps the differences.
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
import os
import random
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
from quality_data import check_data, make_data, make_target  # noqa: E402
from quality_report import curves_of, print_data, print_table, table_of  # noqa: E402
from quality_runs import (  # noqa: E402
    WARMUP, CLIP, digest, gamma_for, make_init, match_wall, run_many, run_ours,
    run_specforge,
)  # fmt: skip
from quality_sizes import REAL_OVERRIDES, SIZES  # noqa: E402


def settings(s, trainer, args):
    """The settings a trainer runs: its primary one, and with --sweep every one of its grid."""
    key = "ours" if trainer == "dflash-top" else "sf"
    primary = dict(s[key])
    if key == "ours":
        for name in ("seq_len", "anchors", "budget", "steps_per_batch", "lr", "target_precision",
                     "optimizer_states"):
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


def parse_args():
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
    ap.add_argument("--ours-steps-per-batch", type=lambda v: v if v == "doc" else int(v),
                    help="dflash-top's --steps-per-batch, N or doc (size's)")
    ap.add_argument("--ours-target-precision", choices=["bf16", "fp8"],
                    help="dflash-top's --target-precision (left out: its default, bf16); the "
                    "drafter is measured against the bf16 target either way")
    ap.add_argument("--ours-optimizer-states", choices=["f32", "bf16"],
                    help="dflash-top's --optimizer-states (left out: its default, f32)")
    ap.add_argument("--ours-only", action="store_true",
                    help="dflash-top's equal-tokens runs only (no SpecForge, wall or sweep rows): "
                    "two of its settings compared across tables by quality_pair.py")
    ap.add_argument("--cores", help="pin both trainers to these cores, e.g. `0` (CPU size: the "
                    "first --threads cores this process may use)")
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
    ap.add_argument("--until", choices=["target", "data", "tokens"], help="stop after this stage")
    ap.add_argument("--measure-procs", type=int,
                    help="processes measuring acceptance side by side, each with its own target "
                    "(8 on cuda, 1 on cpu)")
    ap.add_argument("--measure", choices=["decode", "replay"],
                    help="acceptance by dflash_generate's decoding, or by its replay from one "
                    "forward a prompt (quality_replay.py); decode on cpu, replay on cuda")
    ap.add_argument("--check", type=int, metavar="N",
                    help="also measure the first N drafters the other way and put the "
                    "differences in the table's `measure_check` (all on cpu, 0 on cuda)")
    ap.add_argument("--gen-procs", type=int,
                    help="concurrent `dflash-top generate` processes for the data (8 on cuda, 1 "
                    "on cpu)")
    return ap.parse_args()  # fmt: skip


def prepare_data(args, s, work):
    """The target and its data, made or reused in `work`: (target dir, data dir, data key, data
    counts, mask token id), or None where --until stops before the runs."""
    device = torch.device(args.device)
    gen_device = "cuda:0" if args.device == "cuda" else "cpu"
    gen_procs = args.gen_procs or (8 if args.device == "cuda" else 1)
    if args.target_dir:
        # A prepared target: prompts of real text, its own greedy replies.
        from transformers import AutoConfig, AutoTokenizer

        target_dir = args.target_dir
        if not os.path.isfile(os.path.join(target_dir, "config.json")):
            raise SystemExit(f"--target-dir {target_dir}: no config.json there; give a Hugging "
                             "Face model directory (python/peer/smollm2_target.py makes one)")  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        if not tokenizer.chat_template:
            raise SystemExit(f"--target-dir {target_dir}: its tokenizer has no chat template; "
                             "give an instruction-tuned model's directory")  # fmt: skip
        gen_batch = args.gen_batch or (64 if args.device == "cuda" else 16)
        data_dir, data_key, data_stats = qr.make_real_data(
            work, s, args.bin, target_dir, tokenizer, gen_device, gen_batch, gen_procs)  # fmt: skip
        print_data(data_stats)
        if args.until == "data":
            return None
        qr.check_real_data(data_stats)
        mask_id = args.mask_token_id
        if mask_id is None:
            mask_id = mask_id_of(tokenizer, AutoConfig.from_pretrained(target_dir).vocab_size)
    else:
        lang = cl.Lang(**s["lang"])
        target_dir, tokenizer = make_target(work, args.size, lang, device, args.target_steps)
        if args.until == "target":
            return None
        data_dir, data_key, data_stats = make_data(
            work, args.size, args.bin, target_dir, tokenizer, lang, gen_device, gen_procs
        )
        print_data(data_stats)
        if args.until == "data":
            return None
        check_data(data_stats)
        mask_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    # What the data is, to the byte: the target's training and greedy replies differ from one
    # machine's float kernels to another's, and a figure holds for its data.
    h = hashlib.sha256()
    for name in ("train.jsonl", "eval.jsonl"):
        with open(os.path.join(data_dir, name), "rb") as f:
            h.update(f.read())
    return target_dir, data_dir, data_key, {**data_stats, "sha256": h.hexdigest()[:16]}, mask_id


def train_rows(ctx, args, seeds, ours_set, sf_set):
    """Every training run: equal tokens (every seed), equal wall, the sweep; or None where
    --until tokens stops after the first."""
    tokens = args.tokens or ctx["s"]["tokens"]

    def ours(name, setting, seed, n):
        return run_ours(ctx, f"ours-{name}-s{seed}", setting, seed, n)

    def sf(name, setting, seed, n):
        return run_specforge(ctx, f"sf-{name}-s{seed}", setting, seed, n)

    # Equal target tokens, primary settings, every seed; SpecForge reads as many tokens as ours.
    runs = []
    for seed in seeds:
        points = args.curve if seed < args.curve_seeds else 1
        o = run_ours(ctx, f"ours-tokens-s{seed}", ours_set[0][1], seed, tokens, points)
        runs.append({**o, "row": "equal tokens"})
        if not args.ours_only:
            f = run_specforge(ctx, f"sf-tokens-s{seed}", sf_set[0][1], seed, o["target_tokens"],
                              points)  # fmt: skip
            runs.append({**f, "row": "equal tokens"})
    if args.until == "tokens":
        return None
    if args.ours_only:
        return runs
    # Equal wall time (first optimizer step excluded, for both): the faster trainer trains again,
    # a fresh run on its own schedule, for the tokens its pace gives in the slower one's time.
    # A trainer's time is its least over the seeds (the same tokens each): the first run in a
    # process can pay more than its first step (SpecForge's first seed on an H100 took 64 s
    # where its next two took 33 and 30, flex attention compiling for new shapes, we believe).
    if not args.no_wall:
        warm = {t: min(r["warm_s"] for r in runs if r["trainer"] == t)
                for t in ("dflash-top", "specforge")}  # fmt: skip
        for seed in seeds[: args.wall_seeds]:
            o, f = (next(r for r in runs if r["seed"] == seed and r["trainer"] == t)
                    for t in ("dflash-top", "specforge"))  # fmt: skip
            if warm["dflash-top"] <= warm["specforge"]:
                r = match_wall(o, warm["specforge"], lambda n, i, seed=seed: ours(
                    f"wall{i}", ours_set[0][1], seed, n))  # fmt: skip
                runs += [{**r, "row": "equal wall"},
                         {**f, "row": "equal wall", "same_run": True, "own_warm_s": f["warm_s"],
                          "warm_s": warm["specforge"]}]  # fmt: skip
            else:
                r = match_wall(f, warm["dflash-top"], lambda n, i, seed=seed: sf(
                    f"wall{i}", sf_set[0][1], seed, n))  # fmt: skip
                runs += [{**o, "row": "equal wall", "same_run": True, "own_warm_s": o["warm_s"],
                          "warm_s": warm["dflash-top"]},
                         {**r, "row": "equal wall"}]  # fmt: skip
    # The sweep, at equal tokens: each setting of each trainer's grid (--sweep-procs side by
    # side: the sweep's rows compare tokens, not seconds); the primary setting's rows join it,
    # for its best-of.
    sweep_seeds = seeds[: max(1, args.sweep_seeds)]
    jobs = [(trainer, f"{pre}-sweep{i}-s{seed}", setting, seed, tokens)
            for trainer, pre, sets in [("dflash-top", "ours", ours_set), ("specforge", "sf", sf_set)]
            for i, (kind, setting) in enumerate(sets) if kind == "sweep"
            for seed in sweep_seeds]  # fmt: skip
    runs += [{**r, "row": "sweep"} for r in run_many(ctx, jobs, args.sweep_procs)]
    if args.sweep:
        runs += [{**r, "row": "sweep"} for r in runs
                 if r["row"] == "equal tokens" and r["seed"] in sweep_seeds]  # fmt: skip
    return runs


def measure(args, s, init, runs, eval_rows, target_dir):
    """Acceptance in dflash of every drafter, the untrained `init` and the curves' checkpoints
    too, in one pass; each run gets its per-prompt figures."""
    jobs = [(init, eval_rows[: s["floor_prompts"]])]
    jobs += [(r["drafter"], eval_rows) for r in runs]
    if args.curve > 1:
        jobs += [(c[3], eval_rows) for r in runs if r["row"] == "equal tokens" for c in r["curve"]]
    measure_procs = args.measure_procs or (8 if args.device == "cuda" else 1)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    gen_device = "cuda:0" if args.device == "cuda" else "cpu"
    method = args.measure or ("replay" if args.device == "cuda" else "decode")
    measured = qm.measure_all(jobs, target_dir, gen_device, dtype, s["eval_max_new"],
                              measure_procs, method)  # fmt: skip
    for r in runs:
        r["per_prompt"], r["same_as_greedy"] = measured[r["drafter"]]
    check = args.check if args.check is not None else (0 if args.device == "cuda" else len(jobs))
    other = "decode" if method == "replay" else "replay"
    checked = qm.measure_all(jobs[:check], target_dir, gen_device, dtype, s["eval_max_new"],
                             measure_procs, other) if check else {}  # fmt: skip
    return measured, {"method": method, **qm.compare(measured, checked, other)}


def main():
    args = parse_args()
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
    tmp = None
    work = args.work
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="dflash-quality-")
        work = tmp.name
    os.makedirs(work, exist_ok=True)
    random.seed(0)
    torch.manual_seed(0)
    started = time.time()

    prepared = prepare_data(args, s, work)
    if prepared is None:
        return
    target_dir, data_dir, data_key, data_stats, mask_id = prepared
    train_jsonl = os.path.join(data_dir, "train.jsonl")
    samples = [
        (r["input_ids"], r["loss_mask"]) for r in map(json.loads, open(train_jsonl)) if r
    ]
    eval_rows = [json.loads(x) for x in open(os.path.join(data_dir, "eval.jsonl")) if x.strip()]
    cores = pin(args.cores)
    seeds = list(range(args.seeds or s["seeds"]))
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
    ours_set, sf_set = settings(s, "dflash-top", args), settings(s, "specforge", args)
    runs = train_rows(ctx, args, seeds, ours_set, sf_set)
    if runs is None:
        return

    measured, measure_check = measure(args, s, ctx["init"][0], runs, eval_rows, target_dir)
    curves = curves_of(runs, measured) if args.curve > 1 else []
    meta = {
        "size": args.size,
        "device": args.device,
        "cores": cores,
        "eval_prompts": len(eval_rows),
        "seeds": seeds,
        "data": data_stats,
        "recipe": {k: s[k] for k in ("block", "anchors", "max_length", "drafter_layers")}
        | {"ours": ours_set[0][1], "specforge": sf_set[0][1], "warmup": WARMUP, "clip": CLIP,
           "gamma": gamma_for(s["block"])},
        "measure_check": measure_check,
        "elapsed_s": time.time() - started,
    }  # fmt: skip
    table = table_of(runs, measured[ctx["init"][0]][0], curves, meta)
    print_table(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
