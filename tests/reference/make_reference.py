"""Reference numbers for the Rust engine, made with PyTorch, transformers and z-lab's dflash.

Builds a small random Qwen3 (transformers) and a small random DFlashDraftModel (dflash 0.1.0),
saves both as Hugging Face directories, and saves their outputs on fixed inputs:

    python tests/reference/make_reference.py OUT_DIR

OUT_DIR/target/, OUT_DIR/drafter/ and OUT_DIR/reference.safetensors. The Rust tests load the
same directories and must match these tensors within f32 tolerance. `make test` runs this.
"""
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from dflash.model import DFlashDraftModel

torch.manual_seed(0)
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

H, L, VOCAB, MASK, BLOCK = 64, 6, 256, 255, 4
LAYER_IDS = [1, 3]
common = dict(
    vocab_size=VOCAB,
    hidden_size=H,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    max_position_embeddings=512,
    tie_word_embeddings=False,
    initializer_range=0.2,
)

# --- target -------------------------------------------------------------------------------
target = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=L, **common)).eval()
target.save_pretrained(os.path.join(out, "target"), safe_serialization=True)

S = 24
input_ids = torch.randint(0, MASK, (1, S))
positions = torch.arange(S)[None]
with torch.no_grad():
    hs = target(input_ids, position_ids=positions, output_hidden_states=True).hidden_states
target_hidden = torch.cat([hs[i + 1] for i in LAYER_IDS], dim=-1)

# --- drafter ------------------------------------------------------------------------------
dcfg = Qwen3Config(
    num_hidden_layers=2,
    num_target_layers=L,
    block_size=BLOCK,
    dflash_config={"target_layer_ids": LAYER_IDS, "mask_token_id": MASK, "block_size": BLOCK},
    **common,
)
drafter = DFlashDraftModel(dcfg).eval()
drafter.save_pretrained(os.path.join(out, "drafter"), safe_serialization=True)

# Three blocks, anchors at 0 (no context), 7 and 15; one document.
anchors = torch.tensor([[0, 7, 15]])
A = anchors.shape[1]
block_ids = torch.full((1, A, BLOCK), MASK)
block_ids[:, :, 0] = input_ids.gather(1, anchors)
block_ids = block_ids.view(1, A * BLOCK)
block_pos = (anchors[..., None] + torch.arange(BLOCK)).view(1, A * BLOCK)
# The training mask (README.md, "Architecture"; src/engine/train/blocks.rs): context before the anchor, own block both ways.
q_block = torch.arange(A).repeat_interleave(BLOCK)
ctx = torch.arange(S)[None, :] < anchors[0].repeat_interleave(BLOCK)[:, None]
own = q_block[:, None] == q_block[None, :]
mask = torch.cat([ctx, own], dim=1)[None, None]
with torch.no_grad():
    emb = target.get_input_embeddings()(block_ids)
    draft = drafter(
        position_ids=torch.cat([positions, block_pos], dim=1),
        attention_mask=mask,
        noise_embedding=emb,
        target_hidden=target_hidden,
    )


# --- sliding-window layers as dflash runs them ----------------------------------------------
# The same drafter weights with layer 0 a sliding-attention layer (window 3), run as dflash
# decodes: for each anchor, the context is the target features before it and the block is
# [anchor token, MASK...] at positions anchor..anchor+BLOCK-1, with no attention mask, so that
# dflash builds its own (causal within the window for the sliding layer, open for the full one).
scfg = Qwen3Config.from_dict(dcfg.to_dict())
scfg.layer_types = ["sliding_attention", "full_attention"]
scfg.sliding_window = 3
scfg.use_sliding_window = True  # else transformers drops the window when the config is loaded
sliding = DFlashDraftModel(scfg).eval()
sliding.load_state_dict(drafter.state_dict())
sliding.save_pretrained(os.path.join(out, "drafter_sliding"), safe_serialization=True)
with torch.no_grad():
    sliding_out = []
    for a in anchors[0].tolist():
        ids_a = torch.full((1, BLOCK), MASK)
        ids_a[0, 0] = input_ids[0, a]
        sliding_out.append(
            sliding(
                position_ids=torch.arange(a + BLOCK)[None],
                attention_mask=None,
                noise_embedding=target.get_input_embeddings()(ids_a),
                target_hidden=target_hidden[:, :a],
            )
        )
    sliding_out = torch.cat(sliding_out, dim=1)

# --- training step: SpecForge's DFlash mask and loss, two documents per row and padding --------
# The rules (read from SpecForge's specforge/core/dflash.py, written anew here) with packing:
# a block sees context keys strictly before its anchor in the anchor's own document, its own
# block both ways, no other block; an invalid block sees nothing and is all mask tokens. Label
# at slot k is input_ids[anchor + k]; its weight is keep * (k > 0) * (anchor + k < S) *
# (same document as the anchor: the packing extension) * loss_mask[anchor + k] *
# exp(-(k - 1) / gamma); loss = sum(ce * w) / sum(w). Positions restart in each document; the
# target sees each document alone (so its hidden states are computed document by document).
GAMMA = 4.0  # SpecForge / the paper for block sizes up to 8
S2 = 24
lengths = [[10, 9, 5], [14, 6, 4]]  # two documents, then padding (its own document id)
train_ids = torch.randint(1, MASK, (2, S2))
doc_ids = torch.stack([torch.repeat_interleave(torch.arange(len(l)), torch.tensor(l)) for l in lengths])
pos2 = torch.stack([torch.cat([torch.arange(n) for n in l]) for l in lengths])
loss_mask = torch.ones(2, S2, dtype=torch.bool)
for r, l in enumerate(lengths):
    start = 0
    for d, n in enumerate(l):
        loss_mask[r, start:start + 2] = False  # a two-token prompt per document
        if d == len(l) - 1:
            train_ids[r, start:start + n] = 0
            loss_mask[r, start:start + n] = False  # padding
        start += n
# Anchors near document ends (labels that would cross into the next document, past its prompt,
# or into the padding), and one invalid anchor to pad row 1.
anchors2 = torch.tensor([[2, 9, 11, 17], [3, 12, 18, 0]])
keep = torch.tensor([[True, True, True, True], [True, True, True, False]])
A2 = anchors2.shape[1]

with torch.no_grad():
    per_doc = []
    for r, l in enumerate(lengths):
        parts, start = [], 0
        for n in l:
            hs2 = target(
                train_ids[r:r + 1, start:start + n],
                position_ids=torch.arange(n)[None],
                output_hidden_states=True,
            ).hidden_states
            parts.append(torch.cat([hs2[i + 1] for i in LAYER_IDS], dim=-1))
            start += n
        per_doc.append(torch.cat(parts, dim=1))
    hidden2 = torch.cat(per_doc, dim=0)

slot = torch.arange(BLOCK)
noise = torch.full((2, A2, BLOCK), MASK)
noise[:, :, 0] = torch.where(keep, train_ids.gather(1, anchors2), MASK)
anchor_pos = pos2.gather(1, anchors2)
block_pos2 = (anchor_pos[..., None] + slot).view(2, A2 * BLOCK)
anchor_doc = doc_ids.gather(1, anchors2)

mask2 = torch.zeros(2, A2 * BLOCK, S2 + A2 * BLOCK, dtype=torch.bool)
for r in range(2):
    for a in range(A2):
        if not keep[r, a]:
            continue
        rows = slice(a * BLOCK, (a + 1) * BLOCK)
        for kv in range(S2):
            mask2[r, rows, kv] = kv < anchors2[r, a] and doc_ids[r, kv] == anchor_doc[r, a]
        mask2[r, rows, S2 + a * BLOCK:S2 + (a + 1) * BLOCK] = True
mask2 = mask2[:, None]

label_at = anchors2[..., None] + slot  # [2, A, BLOCK]
inside = label_at < S2
at = label_at.clamp(max=S2 - 1)
labels2 = train_ids[:, None, :].expand(-1, A2, -1).gather(2, at)
same_doc = doc_ids[:, None, :].expand(-1, A2, -1).gather(2, at) == anchor_doc[..., None]
counts = loss_mask[:, None, :].expand(-1, A2, -1).gather(2, at)
weight = (keep[..., None] & inside & same_doc & counts & (slot > 0)).float()
weight = weight * torch.exp(-(slot - 1).clamp(min=0).float() / GAMMA)

drafter.train()
drafter.zero_grad()
emb2 = target.get_input_embeddings()(noise.view(2, A2 * BLOCK)).detach()
out2 = drafter(
    position_ids=torch.cat([pos2, block_pos2], dim=1),
    attention_mask=mask2,
    noise_embedding=emb2,
    target_hidden=hidden2,
)
logits2 = target.lm_head(out2).float()
ce = torch.nn.functional.cross_entropy(logits2.view(-1, VOCAB), labels2.reshape(-1), reduction="none")
loss2 = (ce * weight.view(-1)).sum() / weight.sum()
loss2.backward()
grads = {f"grad.{n}": p.grad.detach().clone() for n, p in drafter.named_parameters()}

save_file(
    {
        "input_ids": input_ids.contiguous(),
        "positions": positions.contiguous(),
        "target_hidden": target_hidden.contiguous(),
        "anchors": anchors.contiguous(),
        "block_ids": block_ids.contiguous(),
        "block_pos": block_pos.contiguous(),
        "mask": mask.contiguous(),
        "drafter_out": draft.contiguous(),
        "sliding_out": sliding_out.contiguous(),
        "train.input_ids": train_ids.contiguous(),
        "train.doc_ids": doc_ids.contiguous(),
        "train.positions": pos2.contiguous(),
        "train.loss_mask": loss_mask.contiguous(),
        "train.target_hidden": hidden2.contiguous(),
        "train.anchors": anchors2.contiguous(),
        "train.anchor_valid": keep.contiguous(),
        "train.mask": mask2.contiguous(),
        "train.labels": labels2.contiguous(),
        "train.weight": weight.contiguous(),
        "train.loss": loss2.detach().reshape(1),
        **grads,
    },
    os.path.join(out, "reference.safetensors"),
)
print(f"reference written to {out}")

import lm_target  # noqa: E402  (beside this script)

lm_target.make(out)

import llama_reference  # noqa: E402  (beside this script)

llama_reference.make(out)
