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
# The training mask of DESIGN.md: context before the anchor, own block both ways.
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
    },
    os.path.join(out, "reference.safetensors"),
)
print(f"reference written to {out}")

import lm_target  # noqa: E402  (beside this script)

lm_target.make(out)
