"""SpecForge 0.2.0 as a throughput peer: its DFlash drafter, loss and train step unmodified, at
dflash-top's preset shapes, side by side with `dflash-top bench engine` (python/peer/compare.py).

The target (transformers' Qwen3 with random weights, the layers up to the deepest captured one,
sdpa, bf16) runs in a thread over the synthetic rows of dflash_peer.py and puts its captured
hidden states on a bounded queue, as SpecForge's online capture hands them over; the main thread
trains SpecForge's `DFlashDraftModel` through `OnlineDFlashModel` (its anchor sampler, block mask,
decayed chunked loss), `BF16Optimizer` (fp32 masters, clip 1.0) and `TrainerCore.train_step`,
one row a sequence, flex attention on CUDA (sdpa on the CPU, where flex has no backward).

Prints one JSON line: tokens per second over the timed steps, step time, peak memory.
Run: python3 sf_peer.py --preset qwen3-0.6b --batch 4 --steps 20
"""

import argparse
import json
import math
import tempfile

import torch
from transformers.models.qwen3.modeling_qwen3 import Qwen3Model

from dflash.model import DFlashDraftModel, build_target_layer_ids
from dflash_peer import (
    Batches,
    Clock,
    mask_token_of,
    start_target,
    taken,
    target_config,
    vocab_of,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--steps", type=int, default=20, help="timed steps after the warm-up")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--drafter-layers", type=int, default=5)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=6e-4, help="SpecForge's recipe: 6e-4")
    args = ap.parse_args()

    from specforge.algorithms.common.dflash_family_data import (
        build_collator,
        normalize_offline_sample,
    )
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.auto import AutoDraftModel
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.model_loading import warm_start_draft_model
    from specforge.training.strategies.base import DFlashTrainStrategy, StepContext
    from transformers import AutoConfig

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if cuda else torch.float32
    backend_name = "flex_attention" if cuda else "sdpa"
    vocab, mask_token = vocab_of(args.preset), mask_token_of(args.preset)
    full = target_config(args.preset)
    layer_ids = build_target_layer_ids(full.num_hidden_layers, args.drafter_layers)
    tcfg = target_config(args.preset, layers=max(layer_ids) + 1)
    std = 0.5 if args.preset == "tiny" else 0.02
    with torch.device(device):
        target = Qwen3Model(tcfg).to(dtype).eval().requires_grad_(False)
        torch.nn.init.normal_(target.embed_tokens.weight, std=std)
        lm_head = torch.nn.Linear(tcfg.hidden_size, vocab, bias=False).to(dtype)
        torch.nn.init.normal_(lm_head.weight, std=std)
    lm_head.requires_grad_(False)

    # The drafter as SpecForge builds it: a z-lab-format config and init, read back by its own
    # AutoDraftModel and warm start (what a run from a released drafter does).
    dcfg = target_config(args.preset, layers=args.drafter_layers)
    dcfg.architectures = ["DFlashDraftModel"]
    dcfg.num_target_layers = full.num_hidden_layers
    dcfg.block_size = args.block
    dcfg.dflash_config = {
        "target_layer_ids": layer_ids,
        "block_size": args.block,
        "mask_token_id": mask_token,
    }
    init = tempfile.TemporaryDirectory(prefix="sf-peer-")
    DFlashDraftModel(dcfg).save_pretrained(init.name, safe_serialization=True)
    config = AutoConfig.from_pretrained(init.name)
    config._attn_implementation = backend_name
    draft = AutoDraftModel.from_config(config, torch_dtype=dtype)
    warm_start_draft_model(draft, init.name, draft_config=config, strategy="dflash")
    draft = draft.to(device=device, dtype=dtype)
    draft.mask_token_id = mask_token
    model = OnlineDFlashModel(
        draft_model=draft,
        target_lm_head=lm_head,
        target_embed_tokens=target.embed_tokens,
        mask_token_id=mask_token,
        block_size=args.block,
        attention_backend=backend_name,
        num_anchors=args.anchors,
        loss_decay_gamma=7.0 if args.block > 10 else 5.0 if args.block > 8 else 4.0,
    ).to(device=device, dtype=dtype)
    total = args.warmup + args.steps

    def optimizer_factory(module):
        return BF16Optimizer(
            module, lr=args.lr, max_grad_norm=1.0, warmup_ratio=0.04, lr_scheduler="cosine",
            total_steps=total,
        )  # fmt: skip

    backend = FSDPTrainingBackend(
        ParallelConfig(world_size=1, param_dtype=dtype), optimizer_factory=optimizer_factory
    )
    wrapped = backend.prepare_model(model, wrap=False, optimizer_target=model.draft_model)
    core = TrainerCore(DFlashTrainStrategy(wrapped), backend)
    collate = build_collator()

    batches = Batches(args.seed, args.batch, args.seq, vocab)
    q, stop, worker = start_target(target, layer_ids, batches, device)
    clock = Clock(device)
    tokens = 0
    losses = []
    for step, hidden, ids, _docs, _pos, loss_mask in taken(q, device, args.warmup, total, clock):
        features = [
            normalize_offline_sample(
                {"input_ids": ids[r], "loss_mask": loss_mask[r].long(), "hidden_states": hidden[r]},
                args.seq,
            )
            for r in range(ids.shape[0])
        ]
        batch = TrainBatch(
            sample_ids=[str(step * args.batch + r) for r in range(ids.shape[0])],
            strategy="dflash",
            tensors=collate(features),
        )
        result = core.train_step(batch, StepContext(global_step=step, total_steps=total))
        losses.append(float(result.metrics.get("loss")))
        if clock.t0 is not None:
            tokens += ids.numel()
    elapsed = clock.elapsed()
    stop.set()
    worker.join()
    print(
        json.dumps(
            {
                "stack": "specforge",
                "preset": args.preset,
                "batch": args.batch,
                "steps": args.steps,
                "tok_per_s": tokens / elapsed,
                "step_ms": elapsed / args.steps * 1000,
                "peak_allocated_gib": (
                    torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0
                ),
                "loss_first": losses[0],
                "loss_last": losses[-1],
                "losses": losses,
                "finite": all(math.isfinite(x) for x in losses),
            }
        )
    )


if __name__ == "__main__":
    main()
