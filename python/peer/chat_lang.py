"""A chat language with long-range structure, its tokenizer and chat template, and a small
Qwen3 target trained on it (for python/peer/quality.py).

The language. Content words w0..w{A-1}, topics t0..t{K-1}, filler words u0..u{F-1}. A
conversation is a system message, then one or more turns. A user message is a few filler words,
a topic word t_k and a seed word `a`. The assistant's reply starts with the seed, then follows the
topic's successor map P_k (a permutation of the words made of one cycle through all of them) and
ends, with the end token `<|im_end|>`, right after the topic's stop word s_k. The seed is drawn
at the distance from s_k that gives the reply length wanted (several length buckets: 50 to 1,500
tokens at the GPU size). So a drafter must read, from the target's hidden states, the topic of
the latest user turn (up to a whole reply back, and not an earlier turn's one), and unroll P_k
from its anchor up to the block's end, and learn where each reply ends.

Rendered with a Qwen3-style ChatML template (written here; `<|im_start|>`, `<|im_end|>` special
tokens) through a WordLevel tokenizer built with the `tokenizers` library; `<|im_end|>` is the
end token (eos) and `<|mask|>` the drafter's mask token.
"""

import json
import math
import os
import random
import time

import torch

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
SYSTEM_PROMPT = "you are a helpful assistant"


class Lang:
    """The rules (seeded): for each topic a one-cycle successor map and a stop word."""

    def __init__(self, words, topics, fillers, seed):
        self.A, self.K, self.F = words, topics, fillers
        rng = random.Random(seed)
        self.P, self.stop, self.dist = [], [], []
        for _ in range(topics):
            order = list(range(words))
            rng.shuffle(order)
            p = [0] * words
            for i, x in enumerate(order):
                p[x] = order[(i + 1) % words]
            stop = order[-1]
            self.P.append(p)
            self.stop.append(stop)
            # words after `x` until the stop word is out
            self.dist.append({x: words - 1 - i for i, x in enumerate(order)})

    def rule(self, k, cur):
        return self.P[k][cur]

    def seeds(self, k, lo, hi):
        """The seeds of topic k whose reply (seed included, end token not) has lo..hi words."""
        return sorted(x for x, d in self.dist[k].items() if lo <= d + 1 <= hi)

    def seed_for(self, rng, k, lo, hi, pool=None):
        """A seed whose reply has lo..hi words; with `pool`, one whose (topic, seed) is in it
        (None when the pool has none for this bucket)."""
        cands = [x for x in self.seeds(k, lo, hi) if pool is None or (k, x) in pool]
        return rng.choice(cands) if cands else None

    def reply(self, rng, k, seed, noise, limit):
        """The rule's reply from the seed (words, no end token). With `noise`, a word is now and
        then replaced by a random one that keeps the reply within `limit` words (so the target
        learns the map off the path too; every reply still ends)."""
        out = [seed]
        d = self.dist[k]
        while out[-1] != self.stop[k]:
            nxt = self.rule(k, out[-1])
            if noise and rng.random() < noise:
                alt = rng.randrange(self.A)
                if len(out) + 1 + d[alt] <= limit:
                    nxt = alt
            out.append(nxt)
        return out

    def follows(self, k, words):
        """(words after the first that follow the rule, words after the first, whether the reply
        ends right after the stop word); words: the reply, end token excluded."""
        ok = sum(1 for i in range(1, len(words)) if words[i] == self.rule(k, words[i - 1]))
        ends = bool(words) and words[-1] == self.stop[k]
        return ok, max(len(words) - 1, 0), ends

    def check_reply(self, k, seed, bucket, words):
        """What a reply (word ids, end token excluded) to a user turn of topic k and seed word
        `seed`, asked for in length bucket (lo, hi), gets right: {first, length, rule, stop}."""
        ok, n, ends = self.follows(k, words)
        return {
            "first": bool(words) and words[0] == seed,
            "length": bucket[0] <= len(words) <= bucket[1],
            "rule": ok == n,
            "stop": ends,
        }


def split_pairs(lang, buckets, held_share, seed):
    """(training pool, held-out pool): the (topic, seed) pairs of the buckets, split at random, a
    `held_share` of each bucket's pairs held out, so that no held-out reply is a training one."""
    rng = random.Random(seed)
    train, held = set(), set()
    for lo, hi in buckets:
        pairs = [(k, x) for k in range(lang.K) for x in lang.seeds(k, lo, hi)]
        rng.shuffle(pairs)
        cut = max(1, round(held_share * len(pairs)))
        held.update(pairs[:cut])
        train.update(pairs[cut:])
    return train, held


def w(i):
    return f"w{i}"


def user_message(rng, lang, k, seed):
    fill = [f"u{rng.randrange(lang.F)}" for _ in range(rng.randrange(4))]
    return " ".join(fill + [f"t{k}", w(seed)])


def sample_turns(rng, lang, buckets, max_turns, budget, pool=None):
    """[(topic, seed, (lo, hi))] for one conversation: 1..max_turns turns whose longest replies
    fit in `budget` words together; with `pool`, (topic, seed) pairs from it only."""
    turns = []
    n = rng.randint(1, max_turns)
    used = 0
    for _ in range(n):
        fits = [b for b in buckets if used + b[1] + 16 <= budget]
        if not fits:
            break
        lo, hi = rng.choice(fits)
        k = rng.randrange(lang.K)
        seed = lang.seed_for(rng, k, lo, hi, pool)
        if seed is None:
            continue
        turns.append((k, seed, (lo, hi)))
        used += hi + 16
    return turns


def ideal_conversation(rng, lang, turns, noise):
    msgs = [{"role": "system", "content": SYSTEM_PROMPT}]
    for k, seed, (_lo, hi) in turns:
        msgs.append({"role": "user", "content": user_message(rng, lang, k, seed)})
        words = lang.reply(rng, k, seed, noise, hi)
        msgs.append({"role": "assistant", "content": " ".join(w(x) for x in words)})
    return msgs


def vocabulary(lang):
    words = ["system", "user", "assistant", "\n"] + SYSTEM_PROMPT.split()
    words += [f"t{k}" for k in range(lang.K)] + [f"u{i}" for i in range(lang.F)]
    words += [w(i) for i in range(lang.A)]
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for x in words:
        vocab.setdefault(x, len(vocab))
    return vocab


def write_tokenizer(d, lang, model_max_length):
    """tokenizer.json (WordLevel; spaces split words, a newline is a token of its own) and
    tokenizer_config.json with the chat template; returns the transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer

    vocab = vocabulary(lang)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(" ", behavior="removed"),
            pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
        ]
    )
    tok.add_special_tokens(SPECIALS)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": CHAT_TEMPLATE,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
                "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
            },
            f,
            indent=2,
        )
    return AutoTokenizer.from_pretrained(d)


def render(tokenizer, msgs, generation_prompt=False):
    return tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def train_target(out, shape, lang, tokenizer, conf, device, log):
    """Trains the target on ideal conversations (LM loss on every token) and saves it as a HF
    directory beside the tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(conf["seed"])
    rng = random.Random(conf["seed"] + 1)
    vocab = len(vocabulary(lang))
    vocab_size = max(64, 1 << math.ceil(math.log2(vocab)))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=conf["max_length"] + 64,
        tie_word_embeddings=False,
        eos_token_id=eos,
        pad_token_id=pad,
        bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(cfg).to(device)
    steps = conf["steps"]
    opt = torch.optim.AdamW(model.parameters(), lr=conf["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / max(1, steps // 20))
        * 0.5
        * (1 + math.cos(math.pi * min(s, steps) / steps)),
    )
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16)
        if device.type == "cuda"
        else torch.autocast("cpu", enabled=False)
    )
    t0 = time.time()
    model.train()
    for step in range(steps):
        seqs = []
        for _ in range(conf["batch"]):
            turns = sample_turns(rng, lang, conf["buckets"], conf["max_turns"], conf["budget"])
            msgs = ideal_conversation(rng, lang, turns, conf["noise"])
            seqs.append(encode(tokenizer, render(tokenizer, msgs))[: conf["max_length"]])
        n = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), n), pad, dtype=torch.long)
        att = torch.zeros((len(seqs), n), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            att[i, : len(s)] = 1
        labels = ids.masked_fill(att == 0, -100)
        ids, att, labels = ids.to(device), att.to(device), labels.to(device)
        with autocast:
            loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"target step {step}/{steps} loss {loss.item():.3f} ({time.time() - t0:.0f}s)")
    model.eval()
    model.config.use_cache = True
    model.float().save_pretrained(out, safe_serialization=True)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.do_sample = False
    model.generation_config.save_pretrained(out)
    return model
