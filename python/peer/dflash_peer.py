"""The Python stack dflash-top replaces, as a drafter-training team builds it today.

A thread runs the frozen target (transformers' Qwen3) over packed rows and puts the captured
hidden states on a bounded queue.Queue; the main thread trains z-lab's DFlashDraftModel on them
with AdamW (fp32 weights, bf16 autocast). Same shapes, anchors, mask and loss as dflash-top:
- rows of whole synthetic documents (lengths uniform in [seq/4, seq], 4 prompt tokens without
  loss; each token followed by a fixed successor nine times in ten, a random token otherwise,
  so that the loss can fall), causal attention within each document through a dense boolean
  mask (SDPA);
- up to `anchors` anchors a document (SpecForge's budget, dflash-top's default), drawn from its
  candidates: positions up to its second-last token whose token and next token carry loss
  (SpecForge's rule; a block may run past the document, whose end is then a label at every
  slot);
- block inputs: the anchor's token then mask tokens; the drafter sees the context before its
  anchor in its document and its own block, through a dense [q, s + q] mask;
- loss: cross-entropy of the frozen lm head's logits on block slots 1.., weighted
  exp(-(k-1)/gamma), normalised by the weights that count.

Prints one JSON line: tokens per second over the timed steps, step time, peak memory.
Run: python3 dflash_peer.py --preset qwen3-8b --steps 20
"""

import argparse
import contextlib
import json
import math
import queue
import random
import threading
import time

import torch
import torch.nn.functional as F
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

from dflash.model import DFlashDraftModel, build_target_layer_ids

# hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied embeddings: Qwen3's
# published shapes, and dflash-top's `tiny` preset (for a quick run on a CPU).
PRESETS = {
    "tiny": (128, 384, 6, 4, 2, 32, 512, False),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True),
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False),
    "qwen3-14b": (5120, 17408, 40, 40, 8, 128, 151936, False),
    "qwen3-32b": (5120, 25600, 64, 64, 8, 128, 151936, False),
}


def vocab_of(preset):
    return PRESETS[preset][6]


def mask_token_of(preset):
    # Qwen3's added mask token; the tiny preset's last id.
    return 151669 if vocab_of(preset) > 151669 else vocab_of(preset) - 1


def target_config(preset, layers=None):
    h, i, n, heads, kv, d, vocab, tied = PRESETS[preset]
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=i,
        num_hidden_layers=layers or n,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=d,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        max_position_embeddings=40960,
        tie_word_embeddings=tied,
        attn_implementation="sdpa",
    )


def gamma_for(block):
    return 4.0 if block <= 8 else 5.0 if block <= 10 else 7.0


def synthetic_row(rng, seq, vocab, successor):
    """Whole documents until the next does not fit, then padding (its own document id)."""
    ids, docs, pos, loss = [], [], [], []
    doc = 0
    pending = None
    while True:
        n = pending or rng.randint(max(seq // 4, 4), seq)
        pending = None
        if n > seq - len(ids):
            break
        t = rng.randrange(vocab)
        for _ in range(n):
            ids.append(t)
            t = successor[t] if rng.random() < 0.9 else rng.randrange(vocab)
        docs += [doc] * n
        pos += list(range(n))
        loss += [i >= 4 for i in range(n)]
        doc += 1
    pad = seq - len(ids)
    ids += [0] * pad
    docs += [doc] * pad
    pos += list(range(pad))
    loss += [False] * pad
    return ids, docs, pos, loss


def sample_anchors(rng, docs, loss, budget):
    picked = []
    start = 0
    while start < len(docs):
        end = start
        while end < len(docs) and docs[end] == docs[start]:
            end += 1
        cands = [p for p in range(start, end - 1) if loss[p] and loss[p + 1]]
        picked += rng.sample(cands, min(budget, len(cands)))
        start = end
    return sorted(picked)


class Batches:
    """Packed rows on the host, like dflash-top's loader."""

    def __init__(self, seed, rows, seq, vocab):
        self.rng = random.Random(seed)
        self.rows, self.seq, self.vocab = rows, seq, vocab
        self.successor = list(range(vocab))
        self.rng.shuffle(self.successor)

    def next(self):
        rows = [
            synthetic_row(self.rng, self.seq, self.vocab, self.successor) for _ in range(self.rows)
        ]
        return [torch.tensor([r[k] for r in rows]) for k in range(4)]


def document_causal_mask(docs):
    s = docs.shape[1]
    idx = torch.arange(s, device=docs.device)
    causal = idx[None, :] <= idx[:, None]
    same = docs[:, :, None] == docs[:, None, :]
    return (same & causal)[:, None]


def on_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def target_worker(model, lm_layers, batches, out, device, stop, stream):
    with torch.no_grad(), on_stream(stream):
        while not stop.is_set():
            ids, docs, pos, loss = (t.to(device, non_blocking=True) for t in batches.next())
            mask = document_causal_mask(docs)
            o = model(
                input_ids=ids,
                position_ids=pos,
                attention_mask=mask,
                output_hidden_states=True,
                use_cache=False,
            )
            hidden = torch.cat([o.hidden_states[i + 1] for i in lm_layers], dim=-1)
            done = None
            if stream is not None:
                done = torch.cuda.Event()
                done.record(stream)
            item = (hidden, ids, docs, pos, loss, done)
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    break
                except queue.Full:
                    pass


def start_target(target, layer_ids, batches, device):
    """The target's thread (`target-0`, on a stream of its own on CUDA) over `batches`: its queue
    of 2, its stop event and the thread."""
    q = queue.Queue(maxsize=2)
    stop = threading.Event()
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    worker = threading.Thread(
        target=target_worker,
        args=(target, layer_ids, batches, q, device, stop, stream),
        name="target-0",
        daemon=True,
    )
    worker.start()
    return q, stop, worker


class Clock:
    """Seconds from the end of the warm-up (the device synchronised, its peak memory reset)."""

    def __init__(self, device):
        self.device, self.t0 = device, None

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def start(self):
        self.sync()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.t0 = time.perf_counter()

    def elapsed(self):
        self.sync()
        return time.perf_counter() - self.t0


def taken(q, device, warmup, total, clock):
    """(step, hidden, ids, docs, pos, loss mask) off the target's queue, `total` of them, this
    stream waiting on the target's; the clock starts at step `warmup`."""
    for step in range(total):
        if step == warmup:
            clock.start()
        hidden, ids, docs, pos, loss_mask, done = q.get()
        if done is not None:
            torch.cuda.current_stream(device).wait_event(done)
        yield step, hidden, ids, docs, pos, loss_mask


def drafter_inputs(rng, ids, docs, pos, loss, block, budget, mask_token, device):
    """Anchors, block ids, positions, the dense drafter mask, labels and their weights."""
    b, s = ids.shape
    docs_h, loss_h = docs.cpu().tolist(), loss.cpu().tolist()
    per_row = [sample_anchors(rng, docs_h[r], loss_h[r], budget) for r in range(b)]
    a = max(1, max(len(r) for r in per_row))
    anchors = torch.zeros(b, a, dtype=torch.long)
    valid = torch.zeros(b, a, dtype=torch.bool)
    for r, row in enumerate(per_row):
        anchors[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        valid[r, : len(row)] = True
    anchors, valid = anchors.to(device), valid.to(device)
    k = torch.arange(block, device=device)
    slots = anchors[:, :, None] + k  # [b, a, block]
    in_row = slots.clamp(max=s - 1)
    block_ids = torch.full((b, a, block), mask_token, device=device)
    block_ids[:, :, 0] = ids.gather(1, anchors)
    block_pos = pos.gather(1, anchors)[:, :, None] + k
    # Context: keys of the anchor's document before the anchor.
    kv = torch.arange(s, device=device)
    anchor_doc = docs.gather(1, anchors)
    ctx = (docs[:, None, :] == anchor_doc[:, :, None]) & (kv[None, None, :] < anchors[:, :, None])
    ctx = ctx & valid[:, :, None]
    ctx = ctx[:, :, None, :].expand(b, a, block, s).reshape(b, a * block, s)
    blk = torch.arange(a, device=device).repeat_interleave(block)
    own = (blk[:, None] == blk[None, :])[None] & valid.repeat_interleave(block, 1)[:, :, None]
    mask = torch.cat([ctx, own.expand(b, -1, -1)], dim=-1)[:, None]
    # Labels: the token at each slot, counted where it is in the same document and carries loss.
    labels = ids.gather(1, in_row.view(b, -1)).view(b, a, block)
    same_doc = docs.gather(1, in_row.view(b, -1)).view(b, a, block) == anchor_doc[:, :, None]
    counts = (
        same_doc
        & loss.gather(1, in_row.view(b, -1)).view(b, a, block)
        & (slots < s)
        & valid[:, :, None]
    )
    counts[:, :, 0] = False
    g = gamma_for(block)
    w = torch.exp(-(k - 1).clamp(min=0).float() / g)
    w[0] = 0
    weights = counts.float() * w
    return block_ids.view(b, -1), block_pos.view(b, -1), mask, labels.view(-1), weights.view(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-8b", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=6e-4, help="AdamW's (SpecForge's 6e-4)")
    args = ap.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    vocab, mask_token = vocab_of(args.preset), mask_token_of(args.preset)
    dtype = torch.bfloat16 if cuda else torch.float32
    full = target_config(args.preset)
    layer_ids = build_target_layer_ids(full.num_hidden_layers, args.drafter_layers)
    # Only the layers up to the deepest captured one run (dflash-top does the same).
    tcfg = target_config(args.preset, layers=max(layer_ids) + 1)
    with torch.device(device):
        target = Qwen3Model(tcfg).to(dtype).eval().requires_grad_(False)
        # dflash-top's presets: 0.02 for the Qwen3 shapes, 0.5 for tiny (which needs larger
        # logits to learn within a few steps).
        std = 0.5 if args.preset == "tiny" else 0.02
        lm_head = torch.randn(vocab, tcfg.hidden_size, dtype=dtype) * std
        torch.nn.init.normal_(target.embed_tokens.weight, std=std)
    dcfg = target_config(args.preset, layers=args.drafter_layers)
    dcfg.num_target_layers = full.num_hidden_layers
    dcfg.dflash_config = {
        "target_layer_ids": layer_ids,
        "block_size": args.block,
        "mask_token_id": mask_token,
    }
    with torch.device(device):
        drafter = DFlashDraftModel(dcfg).float().train()
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)

    batches = Batches(args.seed, args.batch, args.seq, vocab)
    q, stop, worker = start_target(target, layer_ids, batches, device)
    rng = random.Random(args.seed + 1)
    embed = target.embed_tokens.weight
    total = args.warmup + args.steps
    clock = Clock(device)
    tokens = 0
    losses = []
    for step, hidden, ids, docs, pos, loss_mask in taken(q, device, args.warmup, total, clock):
        block_ids, block_pos, mask, labels, weights = drafter_inputs(
            rng, ids, docs, pos, loss_mask, args.block, args.anchors, mask_token, device
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = drafter(
                position_ids=torch.cat([pos, block_pos], dim=1),
                attention_mask=mask,
                noise_embedding=F.embedding(block_ids, embed),
                target_hidden=hidden,
            )
            logits = out.reshape(-1, out.shape[-1]) @ lm_head.t()
        nll = F.cross_entropy(logits.float(), labels, reduction="none")
        loss = (nll * weights).sum() / weights.sum().clamp(min=1e-12)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # the one host sync a step (logging)
        if clock.t0 is not None:
            tokens += ids.numel()
    elapsed = clock.elapsed()
    stop.set()
    # The target thread ends its forward and leaves before the interpreter does (a thread still
    # inside libtorch at exit aborts the process).
    worker.join()
    print(
        json.dumps(
            {
                "stack": "python",
                "preset": args.preset,
                "batch": args.batch,
                "steps": args.steps,
                "tok_per_s": tokens / elapsed,
                "step_ms": elapsed / args.steps * 1000,
                "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0,
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "losses": losses,
                "finite": all(math.isfinite(x) for x in losses),
            }
        )
    )


if __name__ == "__main__":
    main()
