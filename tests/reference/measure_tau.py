"""Acceptance length of a drafter in z-lab's dflash (the end-to-end test, tests/e2e.rs):

    python tests/reference/measure_tau.py DRAFTER_DIR TARGET_DIR GREEDY.jsonl N

GREEDY.jsonl is what `dflash-top generate` wrote (greedy): the prompt is where `loss_mask` is 0,
the target's continuation where it is 1. For its first N lines, runs dflash's speculative
decoding (`dflash_generate`, which `DFlashDraftModel.spec_generate` calls; here with
`return_stats` for the acceptance lengths) greedily, as long as the continuation, with the saved
drafter and with a freshly initialised one of the same config, and prints one JSON line:

- tau: mean tokens per round (accepted draft tokens + the target's own), over all rounds;
- tau_whole_rounds: the same without each sequence's last round, which the length limit or the
  end token cuts short (what a training block measures);
- untrained_tau: tau of the fresh drafter;
- same_as_greedy: every output equals the file's sequence, as lossless greedy speculative
  decoding must (so dflash-top's own greedy decoding agrees with transformers').
"""
import json
import sys
import time

import torch
from transformers import Qwen3ForCausalLM

import dflash.model as dm
from dflash.model import DFlashDraftModel

drafter_dir, target_dir, greedy_path, limit = sys.argv[1:5]
torch.manual_seed(0)
torch.set_num_threads(1)
# dflash times its stats with torch.cuda.synchronize(); on the CPU a plain clock does.
dm._cuda_time = time.perf_counter

target = Qwen3ForCausalLM.from_pretrained(target_dir).float().eval()
eos = target.config.eos_token_id
eos = eos if isinstance(eos, list) else [eos]
trained = DFlashDraftModel.from_pretrained(drafter_dir).float().eval()
untrained = DFlashDraftModel(trained.config).float().eval()

rows = [json.loads(line) for line in open(greedy_path) if line.strip()][: int(limit)]


def run(drafter):
    rounds, whole, same = [], [], True
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        n = mask.index(1)
        out = dm.dflash_generate(
            drafter, target, torch.tensor([ids[:n]]), len(ids) - n, eos, return_stats=True
        )
        rounds += out.acceptance_lengths
        whole += out.acceptance_lengths[:-1]
        same &= out.output_ids[0].tolist() == ids
    return sum(rounds) / len(rounds), sum(whole) / max(len(whole), 1), len(rounds), same


tau, tau_whole, n_rounds, same = run(trained)
untrained_tau, _, _, same_untrained = run(untrained)
print(json.dumps({
    "tau": tau,
    "tau_whole_rounds": tau_whole,
    "untrained_tau": untrained_tau,
    "rounds": n_rounds,
    "same_as_greedy": same and same_untrained,
}))
