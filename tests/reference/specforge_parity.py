"""SpecForge 0.2.0's own supervision rules on fixed inputs, for tests/parity.rs to hold ours to:

    python tests/reference/specforge_parity.py OUT_DIR

Writes OUT_DIR/parity.json and OUT_DIR/chat/ (a tokenizer directory):

- anchors: packed rows (document ids and loss masks). For each document, the candidates SpecForge
  samples from, read off `OnlineDFlashModel._sample_anchor_positions` run on that document as a
  sequence of its own (SpecForge puts one conversation in a sequence) with a budget above its
  length, so that every candidate is drawn; and with a budget of 3, how many it draws.
- chat: conversations rendered and masked by SpecForge's `GeneralParser` / `ThinkingParser`
  with its registered `qwen3-thinking` and `qwen3-instruct` templates (assistant header, end of
  turn, ignored empty think block, default system prompt), through a Qwen3-style Jinja chat
  template (reasoning kept only after the last user turn, `enable_thinking`) and a byte-level
  BPE tokenizer trained here with ChatML's special tokens.
"""
import json
import os
import random
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
from specforge.data.parse import GeneralParser, ThinkingParser
from specforge.data.template import TEMPLATE_REGISTRY

out = sys.argv[1]
os.makedirs(os.path.join(out, "chat"), exist_ok=True)
rng = random.Random(3)


# --- anchors ------------------------------------------------------------------------------
def specforge_anchors(loss_mask, budget):
    """SpecForge's sampler on one document (a batch of one sequence); None when it refuses."""
    model = OnlineDFlashModel.__new__(OnlineDFlashModel)
    model.num_anchors = budget
    mask = torch.tensor([loss_mask], dtype=torch.long)
    try:
        anchors, keep = model._sample_anchor_positions(len(loss_mask), mask, torch.device("cpu"))
    except ValueError:  # no two supervised tokens in a row
        return []
    return sorted(int(a) for a, k in zip(anchors[0], keep[0]) if k)


def random_mask(n):
    kind = rng.randrange(4)
    if kind == 0:  # a prompt, then a reply to the end
        cut = rng.randrange(n)
        return [i >= cut for i in range(n)]
    if kind == 1:  # several turns
        return [((i // rng.randrange(2, 9)) % 2) == 1 for i in range(n)]
    if kind == 2:  # sparse
        return [rng.random() < 0.3 for _ in range(n)]
    return [True] * n


rows = []
for _ in range(40):
    seq = rng.randrange(8, 96)
    docs, mask, d = [], [], 0
    while len(docs) < seq:
        n = min(rng.randrange(1, 40), seq - len(docs))
        docs += [d] * n
        mask += random_mask(n)
        d += 1
    per_doc, drawn = [], []
    start = 0
    while start < seq:
        end = start
        while end < seq and docs[end] == docs[start]:
            end += 1
        m = mask[start:end]
        per_doc.append([start + p for p in specforge_anchors(m, len(m) + 1)])
        drawn.append(len(specforge_anchors(m, 3)))
        start = end
    rows.append({
        "doc_ids": docs,
        "loss_mask": mask,
        "candidates": per_doc,
        "drawn_with_budget_3": drawn,
    })

# --- chat ---------------------------------------------------------------------------------
# A Qwen3-style template, written here: a system turn, user turns, assistant turns whose
# reasoning (`reasoning_content`, or a `<think>...</think>` inside the content) is rendered only
# after the last user turn, and a generation prompt with an empty think block when
# `enable_thinking` is false.
TEMPLATE = """{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'system' or m.role == 'user' -%}
{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}
{%- elif m.role == 'assistant' -%}
{%- set content = m.content -%}
{%- set reasoning = '' -%}
{%- if m.reasoning_content is defined and m.reasoning_content -%}
{%- set reasoning = m.reasoning_content -%}
{%- elif '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- if loop.index0 > ns.last_user and (loop.last or reasoning) -%}
{{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') + '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}
{%- endif -%}"""

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = "the a drafter block token target layer reads writes fast slow yes no why because".split()


def sentence(n):
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


CONVERSATIONS = [
    # one turn
    [{"role": "user", "content": sentence(6)}, {"role": "assistant", "content": sentence(9)}],
    # multi-turn; an earlier turn's think block, which the template strips
    [
        {"role": "user", "content": sentence(5)},
        {"role": "assistant", "content": "<think>\n" + sentence(7) + "\n</think>\n\n" + sentence(8)},
        {"role": "user", "content": sentence(4)},
        {"role": "assistant", "content": sentence(10)},
    ],
    # the last turn's reasoning given apart, as `reasoning_content`
    [
        {"role": "user", "content": sentence(5)},
        {"role": "assistant", "content": sentence(6)},
        {"role": "user", "content": sentence(3)},
        {"role": "assistant", "content": sentence(5), "reasoning_content": sentence(12)},
    ],
    # its own system message
    [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": sentence(4)},
        {"role": "assistant", "content": sentence(4)},
    ],
]

corpus = [TEMPLATE] + [sentence(12) for _ in range(200)] + ["<think>\n\n</think>\n\n"] * 20
bpe = Tokenizer(models.BPE())
bpe.add_tokens(["<think>", "</think>"])  # added, not special, as in Qwen3's tokenizer
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(
    corpus,
    trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    ),
)
chat_dir = os.path.join(out, "chat")
bpe.save(os.path.join(chat_dir, "tokenizer.json"))
with open(os.path.join(chat_dir, "tokenizer_config.json"), "w") as f:
    json.dump({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": TEMPLATE,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
    }, f, indent=1)
hf = PreTrainedTokenizerFast.from_pretrained(chat_dir)

chats = []
for name, parser_cls, thinking in [
    ("qwen3-thinking", ThinkingParser, True),
    ("qwen3-instruct", GeneralParser, False),
]:
    template = TEMPLATE_REGISTRY.get(name)
    parser = parser_cls(hf, template)
    for conv in CONVERSATIONS:
        kwargs = {} if thinking else {"enable_thinking": False}
        ids, mask = parser.parse(conv, max_length=4096, **kwargs)
        chats.append({
            "template": name,
            "enable_thinking": thinking,
            "system_prompt": template.system_prompt,
            "messages": conv,
            "input_ids": ids.tolist(),
            "loss_mask": [bool(x) for x in mask.tolist()],
        })

with open(os.path.join(out, "parity.json"), "w") as f:
    json.dump({"anchors": rows, "chat": chats}, f)
print(f"parity references: {len(rows)} rows, {len(chats)} conversations -> {out}")
