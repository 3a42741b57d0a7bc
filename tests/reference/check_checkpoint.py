"""Checks a drafter checkpoint written by dflash-top against what SpecForge 0.2.0 exports for the
same target and recipe, loads it with z-lab's dflash package, and runs it on the reference inputs
(REFERENCE_DIR: make_reference.py's output, or its llama/ or qwen2/ directory):

    python tests/reference/check_checkpoint.py CKPT_DIR REFERENCE_DIR OUT.safetensors

SpecForge's side is made by its own code: the draft config it generates from the target
directory (`_generate_draft_config` with its DFlash provider, then its layer and block overrides),
the two `dflash_config` fields its training model sets (mask_token_id, target_layer_ids), saved
by its `DFlashDraftModel` in bf16 and normalised as its export gate does (architectures,
auto_map). Every field of that config.json must be in ours with the same value, but for the
fields listed in `NOT_COMPARED` (each with its reason). Ours also carries `torch_dtype` and
`dflash_config.mask_token` (older loaders and SGLang look them up).

Exits non-zero with a message on the first difference, if the weights are not bf16, or if
loading reports missing or unexpected keys; writes the drafter's output on the reference inputs
to OUT.safetensors for the Rust test to compare.
"""
import json
import os
import sys
import tempfile
from types import SimpleNamespace

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from dflash.model import DFlashDraftModel

# Copied from the target by SpecForge, never read by a drafter that loads weights: generation
# settings, the init std of a fresh model, and the version of the library that wrote the file;
# `max_window_layers` matters only with `use_sliding_window` (false in both).
NOT_COMPARED = {
    "transformers_version",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "max_window_layers",
}

ckpt, ref_dir, out = sys.argv[1:4]


def fail(msg):
    print(f"{ckpt}: {msg}")
    sys.exit(1)


def specforge_export(target_dir, layers, block, mask_token_id):
    from specforge.algorithms.dflash.providers import algorithm_providers
    from specforge.modeling.draft.dflash import DFlashDraftModel as SpecForgeDraft
    from specforge.training.model_loading import _apply_draft_overrides, _generate_draft_config

    provider = algorithm_providers().model.draft_config
    cfg = SimpleNamespace(
        model=SimpleNamespace(
            target_model_path=target_dir,
            cache_dir=None,
            trust_remote_code=False,
            draft_num_hidden_layers=layers,
            draft_block_size=block,
        ),
    )
    config = _generate_draft_config(cfg, provider)
    _apply_draft_overrides(cfg, config, provider)
    model = SpecForgeDraft(config)
    config.dflash_config["mask_token_id"] = mask_token_id
    config.dflash_config["target_layer_ids"] = list(model.target_layer_ids)
    with tempfile.TemporaryDirectory() as d:
        model.to(torch.bfloat16).save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            exported = json.load(f)
    exported["architectures"] = ["DFlashDraftModel"]
    exported.pop("auto_map", None)
    return exported


with open(os.path.join(ckpt, "config.json")) as f:
    ours = json.load(f)
theirs = specforge_export(
    os.path.join(ref_dir, "target"),
    ours["num_hidden_layers"],
    ours["block_size"],
    ours["dflash_config"]["mask_token_id"],
)


def compare(ours, theirs, path):
    """Every field of theirs in ours with the same value; tables field by field too."""
    for key, want in theirs.items():
        name = f"{path}{key}"
        if name in NOT_COMPARED:
            continue
        if key not in ours:
            fail(f"config.json lacks `{name}` (SpecForge exports {want!r})")
        if isinstance(want, dict) and isinstance(ours[key], dict):
            compare(ours[key], want, f"{name}.")
        elif ours[key] != want:
            fail(f"config.json `{name}` is {ours[key]!r}, SpecForge exports {want!r}")


compare(ours, theirs, "")
if ours.get("torch_dtype") != "bfloat16":
    fail(f"config.json `torch_dtype` is {ours.get('torch_dtype')!r}, not 'bfloat16'")
mask_token = ours["dflash_config"].get("mask_token")
if not isinstance(mask_token, str) or not mask_token:
    fail(f"config.json `dflash_config.mask_token` is {mask_token!r}, not the mask token's text")
if ours["dflash_config"].get("block_size") != ours["block_size"]:
    fail("`dflash_config.block_size` differs from `block_size`")
with safe_open(os.path.join(ckpt, "model.safetensors"), "pt") as f:
    kinds = {f.get_tensor(k).dtype for k in f.keys()}
if kinds != {torch.bfloat16}:
    fail(f"model.safetensors holds {kinds}, not bf16 alone")

model, info = DFlashDraftModel.from_pretrained(ckpt, output_loading_info=True)
bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
if bad:
    fail(f"loading: {bad}")
model = model.float().eval()
ref = load_file(os.path.join(ref_dir, "reference.safetensors"))
target = AutoModelForCausalLM.from_pretrained(os.path.join(ref_dir, "target")).eval()
with torch.no_grad():
    emb = target.get_input_embeddings()(ref["block_ids"])
    y = model(
        position_ids=torch.cat([ref["positions"], ref["block_pos"]], dim=1),
        attention_mask=ref["mask"],
        noise_embedding=emb,
        target_hidden=ref["target_hidden"],
    )
print(f"{len(theirs) - len(NOT_COMPARED & theirs.keys())} fields as SpecForge exports them")
save_file({"drafter_out": y.contiguous()}, out)
