"""One training step of SpecForge 0.2.0 on fixed inputs, for tests/parity.rs to hold ours to:

    python tests/reference/specforge_step.py OUT_DIR

A small random Qwen3 target (transformers) gives the hidden states, the embedding and the lm
head; a small random `DFlashDraftModel` (SpecForge's own) is saved as a drafter directory that
our checkpoint loader reads. Then SpecForge's `OnlineDFlashModel.forward` (sdpa attention, no
FSDP: the CPU) runs on a batch of two rows with anchors fixed here (its sampler is replaced by
one that returns them: the only change to its code path), backward, and one `BF16Optimizer`
step with the settings of step.json (our engine's: clip 1.0, cosine with 4% warm-up over 100
steps, so step 1's lr is a quarter of the peak, not zero; weight decay 0; gamma 7 for block 16).

It runs twice from the same bf16-representable weights and inputs:

- `bf16`: as SpecForge trains, the drafter, embedding, lm head and hidden states in bf16, the
  optimizer's fp32 master copies updated and rounded back into the bf16 weights;
- `fp32`: the same code with everything in fp32 (its masters are then the weights themselves),
  which our CPU step matches to f32 rounding.

Writes OUT_DIR/drafter/ (config.json, model.safetensors in bf16: the weights before the step),
OUT_DIR/batch.safetensors (input_ids, loss_mask, doc_ids, hidden, embed, lm_head, anchors,
anchor_valid), OUT_DIR/{bf16,fp32}.safetensors (loss, grad_norm, lr, and per drafter tensor
`grad.`, `master.`, `weight.`, `exp_avg.`, `exp_avg_sq.`) and OUT_DIR/step.json (the settings, and
SpecForge's lr for every update of runs of a few lengths).
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
from specforge.modeling.draft.dflash import DFlashDraftModel
from specforge.optimizer import BF16Optimizer

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(0)

H, L, VOCAB, MASK, BLOCK = 64, 6, 256, 255, 16
LAYER_IDS = [1, 3]
# Our engine's recipe (src/engine/train/step.rs, loss.rs, schedule.rs, optim.rs).
SETTINGS = {
    "block_size": BLOCK,
    "loss_decay_gamma": 7.0,
    "lr": 6e-3,
    "total_steps": 100,
    "warmup_ratio": 0.04,
    "lr_scheduler": "cosine",
    "max_grad_norm": 1.0,
    "weight_decay": 0.0,
    "betas": [0.9, 0.999],
    "eps": 1e-8,
    "attention_backend": "sdpa",
}
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


def bf16_exact(t):
    """`t` rounded to bf16 and widened back: the same values in either precision."""
    return t.detach().to(torch.bfloat16).float()


# --- the batch: two rows, one conversation each (SpecForge's one conversation a sequence) -----
# Row 0: a prompt of 8 tokens, then a reply to the row's end. Row 1: a reply with an unsupervised
# stretch, 30 tokens, then 10 of padding (token 0, no loss; a document of its own on our side).
B, S = 2, 40
gen = torch.Generator().manual_seed(1)
input_ids = torch.randint(1, MASK, (B, S), generator=gen)
loss_mask = torch.zeros(B, S, dtype=torch.long)
loss_mask[0, 8:] = 1
loss_mask[1, 4:30] = 1
loss_mask[1, 14:18] = 0
input_ids[1, 30:] = 0
doc_ids = torch.zeros(B, S, dtype=torch.long)
doc_ids[1, 30:] = 1
# Anchors: each where its token and the next carry loss; blocks that run past the row's end
# (row 0) and the document's end (row 1), one over the unsupervised stretch; row 1 has fewer,
# so its last slot is a padding block (kept false).
anchors = torch.tensor([[8, 11, 19, 30, 37], [5, 12, 20, 27, 0]])
anchor_valid = torch.tensor([[True] * 5, [True] * 4 + [False]])
for r in range(B):
    for a, v in zip(anchors[r].tolist(), anchor_valid[r].tolist()):
        assert not v or (loss_mask[r, a] and loss_mask[r, a + 1]), (r, a)

# --- the target: hidden states of its layers LAYER_IDS, its embedding and lm head -----------
target = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=L, **common)).eval()
with torch.no_grad():
    positions = torch.arange(S)[None].expand(B, -1)
    hs = target(input_ids, position_ids=positions, output_hidden_states=True).hidden_states
hidden = bf16_exact(torch.cat([hs[i + 1] for i in LAYER_IDS], dim=-1))
embed = bf16_exact(target.model.embed_tokens.weight)
lm_head = bf16_exact(target.lm_head.weight)

# --- the drafter: SpecForge's DFlashDraftModel, its weights rounded to bf16 ------------------
dcfg = Qwen3Config(
    num_hidden_layers=2,
    num_target_layers=L,
    block_size=BLOCK,
    architectures=["DFlashDraftModel"],
    dflash_config={"target_layer_ids": LAYER_IDS, "mask_token_id": MASK, "block_size": BLOCK},
    **common,
)
dcfg._attn_implementation = SETTINGS["attention_backend"]
init = DFlashDraftModel(dcfg)
# Norm weights away from their init of ones, so that a mix-up of them shows.
with torch.no_grad():
    for name, p in init.named_parameters():
        if name.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
start = {k: bf16_exact(v) for k, v in init.state_dict().items()}
init.to(torch.bfloat16).save_pretrained(os.path.join(out, "drafter"), safe_serialization=True)


def fixed_anchors(self, seq_len, mask, device):
    """Stands in for `OnlineDFlashModel._sample_anchor_positions`: the anchors chosen above, in
    its format (sorted positions, 0 where not kept, and the keep mask)."""
    return anchors.to(device), anchor_valid.to(device)


OnlineDFlashModel._sample_anchor_positions = fixed_anchors


def run(dtype):
    draft = DFlashDraftModel(dcfg)
    draft.load_state_dict(start)
    draft = draft.to(dtype).train()
    head = torch.nn.Linear(H, VOCAB, bias=False)
    head.weight.data = lm_head.to(dtype)
    emb = torch.nn.Embedding(VOCAB, H)
    emb.weight.data = embed.to(dtype)
    head.requires_grad_(False)
    emb.requires_grad_(False)
    model = OnlineDFlashModel(
        draft_model=draft,
        target_lm_head=head,
        target_embed_tokens=emb,
        mask_token_id=MASK,
        block_size=BLOCK,
        attention_backend=SETTINGS["attention_backend"],
        num_anchors=512,
        loss_decay_gamma=SETTINGS["loss_decay_gamma"],
    )
    opt = BF16Optimizer(
        draft,
        lr=SETTINGS["lr"],
        weight_decay=SETTINGS["weight_decay"],
        max_grad_norm=SETTINGS["max_grad_norm"],
        total_steps=SETTINGS["total_steps"],
        warmup_ratio=SETTINGS["warmup_ratio"],
        lr_scheduler=SETTINGS["lr_scheduler"],
    )
    loss, _, _ = model(input_ids, hidden.to(dtype), loss_mask)
    assert torch.isfinite(loss), loss
    loss.backward()
    names = [n for n, p in draft.named_parameters() if p.requires_grad]
    tensors = {f"grad.{n}": p.grad.float().clone() for n, p in draft.named_parameters()}
    lr = opt.get_learning_rate()
    grad_norm = opt.step()
    for n, p, mp in zip(names, opt.model_params, opt.fp32_params):
        state = opt.optimizer.state[mp]
        tensors[f"master.{n}"] = mp.detach().clone()
        tensors[f"weight.{n}"] = p.detach().float().clone()
        tensors[f"exp_avg.{n}"] = state["exp_avg"].clone()
        tensors[f"exp_avg_sq.{n}"] = state["exp_avg_sq"].clone()
    tensors["loss"] = loss.detach().float().reshape(1)
    tensors["grad_norm"] = grad_norm.detach().float().reshape(1)
    tensors["lr"] = torch.tensor([lr], dtype=torch.float64)
    return tensors, float(loss.detach()), float(grad_norm), lr


batch = {
    "input_ids": input_ids,
    "loss_mask": loss_mask.to(torch.uint8),
    "doc_ids": doc_ids,
    "hidden": hidden,
    "embed": embed,
    "lm_head": lm_head,
    "anchors": anchors,
    "anchor_valid": anchor_valid.to(torch.uint8),
}
save_file({k: v.contiguous() for k, v in batch.items()}, os.path.join(out, "batch.safetensors"))
# SpecForge's lr schedule over whole runs (what step 1's lr comes from): the lr of each update,
# for run lengths whose 4% warm-up is a whole number of steps, a fraction, and under one step.
schedules = {}
for total in [100, 110, 30, 7]:
    dummy = BF16Optimizer(
        torch.nn.Linear(1, 1), lr=SETTINGS["lr"], total_steps=total,
        warmup_ratio=SETTINGS["warmup_ratio"], lr_scheduler=SETTINGS["lr_scheduler"],
    )  # fmt: skip
    lrs = []
    for _ in range(total):
        lrs.append(dummy.get_learning_rate())
        dummy.optimizer.step()  # no gradients: nothing moves; the order `BF16Optimizer.step` keeps
        dummy.scheduler.step()
    schedules[str(total)] = lrs
summary = {}
for name, dtype in [("bf16", torch.bfloat16), ("fp32", torch.float32)]:
    tensors, loss, norm, lr = run(dtype)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, f"{name}.safetensors"))
    summary[name] = {"loss": loss, "grad_norm": norm, "lr": lr}
with open(os.path.join(out, "step.json"), "w") as f:
    json.dump({"settings": SETTINGS, "runs": summary, "schedules": schedules}, f, indent=1)
print(f"specforge step: {json.dumps(summary)} -> {out}")
