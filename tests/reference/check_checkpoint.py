"""Loads a drafter checkpoint written by dflash-top with z-lab's dflash package and runs it on
the reference inputs:

    python tests/reference/check_checkpoint.py CKPT_DIR REFERENCE_DIR OUT.safetensors

Exits non-zero if loading reports missing or unexpected keys; writes the drafter's output on the
reference inputs to OUT.safetensors for the Rust test to compare.
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3ForCausalLM

from dflash.model import DFlashDraftModel

ckpt, ref_dir, out = sys.argv[1:4]
model, info = DFlashDraftModel.from_pretrained(ckpt, output_loading_info=True)
bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
if bad:
    print(f"loading {ckpt}: {bad}")
    sys.exit(1)
model = model.float().eval()
ref = load_file(os.path.join(ref_dir, "reference.safetensors"))
target = Qwen3ForCausalLM.from_pretrained(os.path.join(ref_dir, "target")).eval()
with torch.no_grad():
    emb = target.get_input_embeddings()(ref["block_ids"])
    y = model(
        position_ids=torch.cat([ref["positions"], ref["block_pos"]], dim=1),
        attention_mask=ref["mask"],
        noise_embedding=emb,
        target_hidden=ref["target_hidden"],
    )
print("target_layer_ids", model.target_layer_ids, "block_size", model.block_size, "mask", model.mask_token_id)
save_file({"drafter_out": y.contiguous()}, out)
