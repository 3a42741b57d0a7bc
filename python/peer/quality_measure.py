"""The acceptance measurement of python/peer/quality.py: each drafter drafts for the target in
z-lab dflash 0.1.0's `dflash_generate` (greedy) on the held-out prompts; acceptance length per
prompt (tokens per round) and how many outputs equal the greedy reply.

Each drafter's result is kept beside its weights (`acceptance-KEY.json`, KEY from the prompts,
the reply lengths, the device and the dtype), so a measurement cut short resumes where it
stopped. With `procs` > 1 the drafters are shared out over that many processes, each holding
its own copy of the target: a small target's decoding is bound by kernel launches, one
process's at a time, so processes side by side fill the GPU that one leaves idle.
"""

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import torch

from quality_runs import digest, log

_TARGET = {}


def load_target(target_dir, device, dtype):
    """The target for this process (once)."""
    from transformers import AutoModelForCausalLM

    if "model" not in _TARGET:
        if device == "cpu":
            import dflash.model as dm

            # dflash times its stats with torch.cuda.synchronize(); on the CPU a plain clock.
            dm._cuda_time = time.perf_counter
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
        _TARGET["model"] = model.to(torch.device(device)).eval()
    return _TARGET["model"]


def measure(drafter_dir, target, eval_rows, device, dtype, max_new):
    """(acceptance length per prompt, outputs equal to the greedy reply) of one drafter."""
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


# The file each method keeps beside a drafter: `acceptance-KEY.json` (decoded), `replay-KEY.json`.
PREFIX = {"decode": "acceptance", "replay": "replay"}


def _result_path(drafter_dir, eval_rows, device, dtype, max_new, method="decode"):
    key = digest([[(r["prompt"], r["reply"][:max_new]) for r in eval_rows], max_new,
                  str(dtype), device.split(":")[0]])  # fmt: skip
    return os.path.join(drafter_dir, f"{PREFIX[method]}-{key[:16]}.json")


def _keep(path, per, same):
    with open(path + ".tmp", "w") as f:
        json.dump({"per_prompt": per, "same_as_greedy": same}, f)
    os.replace(path + ".tmp", path)


def _measure_one(job):
    drafter_dir, target_dir, eval_rows, device, dtype, max_new = job
    torch.set_num_threads(1)
    t0 = time.time()
    target = load_target(target_dir, device, dtype)
    per, same = measure(drafter_dir, target, eval_rows, device, dtype, max_new)
    _keep(_result_path(drafter_dir, eval_rows, device, dtype, max_new), per, same)
    return drafter_dir, per, same, time.time() - t0


def _replay_all(todo, target_dir, device, dtype, max_new, report):
    """Every drafter of `todo` measured by replay (quality_replay.py), in this process: the
    target's greedy replies and captured states made once for each set of prompts."""
    from dflash.model import DFlashDraftModel

    from quality_replay import Replay

    target = load_target(target_dir, device, dtype)
    replays = {}
    for d, _, rows, *_ in todo:
        t0 = time.time()
        key = digest([r["prompt"] for r in rows])
        if key not in replays:
            replays[key] = Replay(target, rows, device, max_new, batch=16 if "cuda" in device else 1)
        drafter = DFlashDraftModel.from_pretrained(d).to(device=device, dtype=dtype).eval()
        per, same = replays[key].acceptance(drafter)
        _keep(_result_path(d, rows, device, dtype, max_new, "replay"), per, same)
        report(d, per, same, time.time() - t0)


def measure_all(jobs, target_dir, device, dtype, max_new, procs=1, method="decode"):
    """{drafter dir: (per prompt, same)} for `jobs`, a list of (drafter dir, eval rows), by
    `method`: "decode" (dflash_generate) or "replay" (quality_replay.py); results kept beside
    each drafter are read, not measured again."""
    done = {}
    todo = []
    for d, rows in jobs:
        if d in done or any(d == t[0] for t in todo):
            continue
        try:
            with open(_result_path(d, rows, device, dtype, max_new, method)) as f:
                got = json.load(f)
            done[d] = (got["per_prompt"], got["same_as_greedy"])
        except (OSError, ValueError, KeyError):
            todo.append((d, target_dir, rows, device, dtype, max_new))
    if todo:
        log(f"dflash {method}: {len(todo)} drafters to measure ({len(done)} kept), "
            f"{procs if method == 'decode' else 1} process(es)")  # fmt: skip

    def report(d, per, same, secs):
        done[d] = (per, same)
        log(f"dflash {method}: {os.path.basename(os.path.dirname(d)) or d}/{os.path.basename(d)} "
            f"acceptance {sum(per) / len(per):.3f} ({same}/{len(per)} outputs as greedy, "
            f"{secs:.0f}s)")  # fmt: skip

    if method == "replay":
        _replay_all(todo, target_dir, device, dtype, max_new, report)
        return done
    if procs <= 1 or len(todo) <= 1:
        for job in todo:
            report(*_measure_one(job))
        return done
    with ProcessPoolExecutor(max_workers=min(procs, len(todo)),
                             mp_context=get_context("spawn")) as pool:  # fmt: skip
        for result in pool.map(_measure_one, todo):
            report(*result)
    return done


def compare(measured, checked, other):
    """How the drafters measured both ways agree: {"other", "drafters", "prompts", "equal"
    (prompts with the same acceptance length), "max_abs", "mean_diff" (this way minus other)}."""
    both = [d for d in checked if d in measured]
    pairs = [(a, b) for d in both for a, b in zip(measured[d][0], checked[d][0])]
    return {
        "other": other,
        "drafters": len(both),
        "prompts": len(pairs),
        "equal": sum(abs(a - b) < 1e-9 for a, b in pairs),
        "max_abs": max((abs(a - b) for a, b in pairs), default=0.0),
        "mean_diff": sum(a - b for a, b in pairs) / len(pairs) if pairs else 0.0,
    }
