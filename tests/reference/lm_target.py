"""A small Qwen3 that has learnt a simple language, for the end-to-end test (tests/e2e.rs):
`dflash-top generate` writes its greedy continuations, `dflash-top train` trains a drafter on
them, and tests/reference/measure_tau.py measures that drafter in z-lab's dflash.

The language: tokens 1..A; after (prev, cur) comes P[cur] when prev <= A/2, else Q[cur] (two
random permutations), so a drafter must read the context (the target's hidden states) as well as
its anchor token; P sends one token to EOS, which ends a text. Training text has 10% random
tokens; the trained target's greedy continuation follows the rule (checked here).

Writes OUT/lm/target/ (config.json with eos_token_id, model.safetensors, generation_config.json),
OUT/lm/train_prompts.jsonl and OUT/lm/eval_prompts.jsonl (prompts as `input_ids`).
"""
import json
import os

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

A, EOS, VOCAB, MASK = 48, 49, 256, 255
STEPS = 150


def make(out):
    gen = torch.Generator().manual_seed(1)
    p_map = torch.randperm(A, generator=gen) + 1
    q_map = torch.randperm(A, generator=gen) + 1
    p_map[5] = EOS

    def rand_token():
        return int(torch.randint(1, A + 1, (1,), generator=gen))

    def rule(prev, cur):
        return int((p_map if prev <= A // 2 else q_map)[cur - 1])

    def text(n, noise):
        t = [rand_token(), rand_token()]
        while len(t) < n:
            if t[-1] == EOS:
                t += [rand_token(), rand_token()]
            elif torch.rand((), generator=gen) < noise:
                t.append(rand_token())
            else:
                t.append(rule(t[-2], t[-1]))
        return t[:n]

    torch.manual_seed(1)
    torch.set_num_threads(1)
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = Qwen3ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(STEPS):
        x = torch.tensor([text(64, 0.1) for _ in range(16)])
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

    # The greedy continuation follows the rule (else the test below would measure noise).
    prompts = [text(6, 0.0) for _ in range(80)]
    right = total = 0
    with torch.no_grad():
        for p in prompts[:10]:
            ids = model.generate(
                torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=EOS
            )[0].tolist()
            for i in range(len(p), len(ids)):
                total += 1
                right += ids[i] == rule(ids[i - 2], ids[i - 1])
    assert right >= 0.95 * total, f"the target learnt the rule on {right}/{total} tokens only"

    d = os.path.join(out, "lm")
    model.save_pretrained(os.path.join(d, "target"), safe_serialization=True)
    for name, part in (("train", prompts[:64]), ("eval", prompts[64:])):
        with open(os.path.join(d, f"{name}_prompts.jsonl"), "w") as f:
            for p in part:
                f.write(json.dumps({"input_ids": p}) + "\n")
    print(f"language target written to {d} (greedy follows the rule on {right}/{total})")
