"""SpecForge 0.2.0's DFlash trainer on one process (for python/peer/quality.py).

What runs unmodified, imported from the installed `specforge` package:
- the model: `specforge.modeling.draft.dflash.DFlashDraftModel` built by `AutoDraftModel` from the
  shared init's config and warm-started from its weights by `warm_start_draft_model`;
- the training wrapper: `OnlineDFlashModel` (anchor sampling, block mask, noise embedding, decayed
  and chunked loss), with the target's embeddings and lm head from `TargetEmbeddingsAndHead`;
- the step: `DFlashTrainStrategy` + `TrainerCore.train_step` (gradient normalisation by the loss
  denominator) + `FSDPTrainingBackend` + `BF16Optimizer` (fp32 master weights, grad clipping, the
  cosine schedule with warm-up);
- the data path: `normalize_offline_sample` (truncation to max_length, the two-supervised-tokens
  check) and the DFlash collator (`build_collator`: zero padding), one conversation a sequence;
- the target feature: `extract_context_feature` (hidden_states[layer_id + 1], concatenated).

Substituted, because they cannot run on one process:
- SpecForge 0.2.0 captures the target's hidden states online from SGLang servers (or reads them
  from disk offline); here the transformers target runs in the same process under no-grad and its
  `output_hidden_states` go through SpecForge's own `extract_context_feature`, which is what the
  capture delivers; a step's conversations go through the target in one padded batch (as
  dflash-top's target worker takes a packed batch), not one at a time;
- `FSDPTrainingBackend.prepare_model(..., wrap=False)`: no FSDP/DDP wrapper (one process, no
  process group); SpecForge's FSDP runs the drafter in bf16 (`MixedPrecision`), so on CUDA the
  model is cast to bf16 as SpecForge's model providers do (`.to(dtype=bfloat16)`), with
  BF16Optimizer's fp32 masters; on the CPU everything stays fp32 (as dflash-top's CPU path);
- attention: `sdpa` on the CPU (flex attention has no CPU backward), `flex_attention` on CUDA.
"""

import time

import torch


def plan_steps(samples, tokens, batch_size, max_length):
    """Steps (of `batch_size` conversations, cycling through `samples` in order) until the target
    has read `tokens` tokens; returns (steps, tokens read)."""
    steps = read = i = 0
    while read < tokens:
        for _ in range(batch_size):
            read += min(len(samples[i % len(samples)][0]), max_length)
            i += 1
        steps += 1
    return steps, read


def load_target(target_dir, dtype, device):
    """The frozen target as its own config names it (Qwen3, Llama, Qwen2...), with sdpa."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=dtype, attn_implementation="sdpa"
    ).to(device)
    return target.eval().requires_grad_(False)


def train(
    *,
    target_dir,
    init_dir,
    samples,
    tokens,
    out_dir,
    max_length,
    batch_size,
    lr,
    warmup_ratio,
    max_grad_norm,
    num_anchors,
    gamma,
    device,
    seed,
    log,
    save_every=None,
):
    from transformers import AutoConfig

    from specforge.algorithms.common.dflash_family_data import (
        build_collator,
        normalize_offline_sample,
    )
    from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.draft.dflash import extract_context_feature
    from specforge.modeling.target.target_utils import TargetEmbeddingsAndHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.backend import FSDPTrainingBackend, ParallelConfig
    from specforge.training.controller import TrainerCore
    from specforge.training.model_loading import warm_start_draft_model
    from specforge.training.strategies.base import DFlashTrainStrategy, StepContext

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    backend_name = "flex_attention" if cuda else "sdpa"
    torch.manual_seed(seed)
    if cuda:
        torch.cuda.manual_seed_all(seed)

    steps, planned = plan_steps(samples, tokens, batch_size, max_length)

    target = load_target(target_dir, dtype, device)

    config = AutoConfig.from_pretrained(init_dir)
    config._attn_implementation = backend_name
    draft = AutoDraftModel.from_config(config, torch_dtype=dtype)
    warm_start_draft_model(draft, init_dir, draft_config=config, strategy="dflash")
    draft = draft.to(device=device, dtype=dtype)
    mask_token_id = int(config.dflash_config["mask_token_id"])
    draft.mask_token_id = mask_token_id
    parts = TargetEmbeddingsAndHead.from_pretrained(target_dir, device=device.type, dtype=dtype)
    model = OnlineDFlashModel(
        draft_model=draft,
        target_lm_head=parts.lm_head,
        target_embed_tokens=parts.embed_tokens,
        mask_token_id=mask_token_id,
        block_size=int(draft.block_size),
        attention_backend=backend_name,
        num_anchors=num_anchors,
        loss_decay_gamma=gamma,
    ).to(device=device, dtype=dtype)

    def optimizer_factory(module):
        return BF16Optimizer(
            module,
            lr=lr,
            max_grad_norm=max_grad_norm,
            warmup_ratio=warmup_ratio,
            lr_scheduler="cosine",
            total_steps=steps,
        )

    backend = FSDPTrainingBackend(
        ParallelConfig(world_size=1, param_dtype=dtype), optimizer_factory=optimizer_factory
    )
    wrapped = backend.prepare_model(model, wrap=False, optimizer_target=model.draft_model)
    core = TrainerCore(DFlashTrainStrategy(wrapped), backend)
    collate = build_collator()
    layer_ids = list(draft.target_layer_ids)

    history = []
    read = 0
    i = 0
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    first_step_s = None
    curve = []  # (step, target tokens, seconds after the first step) of each saved point
    for step in range(steps):
        features, ids_of, rows = [], [], []
        for _ in range(batch_size):
            ids, mask = samples[i % len(samples)]
            ids_of.append(str(i % len(samples)))
            i += 1
            rows.append((ids[:max_length], mask[:max_length]))
        # The step's conversations through the target at once, right-padded.
        width = max(len(ids) for ids, _ in rows)
        ids_b = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        att_b = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for r, (ids, _) in enumerate(rows):
            ids_b[r, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
            att_b[r, : len(ids)] = 1
        with torch.no_grad():
            out = target(
                ids_b,
                attention_mask=att_b if len(rows) > 1 else None,
                output_hidden_states=True,
                logits_to_keep=1,
            )
            hidden_b = extract_context_feature(out.hidden_states, layer_ids)
        for r, (ids, mask) in enumerate(rows):
            n = len(ids)
            read += n
            features.append(
                normalize_offline_sample(
                    {
                        "input_ids": ids_b[r, :n],
                        "loss_mask": torch.tensor(mask, dtype=torch.long, device=device),
                        "hidden_states": hidden_b[r, :n],
                    },
                    max_length,
                )
            )
        batch = TrainBatch(sample_ids=ids_of, strategy="dflash", tensors=collate(features))
        result = core.train_step(batch, StepContext(global_step=step, total_steps=steps))
        if cuda and ((step + 1) % 16 == 0 or step == 0):
            torch.cuda.synchronize()
        if step == 0:
            # Warm-up (first-call allocation; flex attention's compile on CUDA) ends here.
            first_step_s = time.perf_counter() - t0
        if save_every and (step + 1) % save_every == 0 and step + 1 < steps:
            # A point of the learning curve; the writing is left out of the clock.
            if cuda:
                torch.cuda.synchronize()
            paused = time.perf_counter()
            draft.save_pretrained(f"{out_dir}/step-{step + 1:06d}", safe_serialization=True)
            curve.append((step + 1, read, paused - t0 - first_step_s))
            t0 += time.perf_counter() - paused
        history.append(
            {
                "t": time.perf_counter() - t0,
                "read": read,
                "step": step + 1,
                "loss": result.metrics.get("loss"),
                "acc": result.metrics.get("acc"),
                "grad_norm": result.grad_norm,
            }
        )
        if (step + 1) % max(1, steps // 8) == 0 or step + 1 == steps:
            log(
                f"specforge step {step + 1}/{steps} loss {result.metrics.get('loss'):.4f} "
                f"acc {result.metrics.get('acc'):.3f} ({time.perf_counter() - t0:.0f}s)"
            )
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    # The draft weights as SpecForge exports them (its DFlashDraftModel's save_pretrained).
    draft.save_pretrained(out_dir, safe_serialization=True)
    late = history[len(history) * 3 // 4 :] or history
    return {
        "steps": steps,
        "target_tokens": read,
        "wall_s": wall,
        "first_step_s": first_step_s,
        "warm_s": wall - first_step_s,
        "final_loss": history[-1]["loss"],
        "late_acc": sum(h["acc"] for h in late) / len(late),
        "tau": None,  # OnlineDFlashModel (loss_type dflash) reports accuracy, no accept length
        "trace": [(h["read"], h["t"]) for h in history],
        "curve": curve + [(steps, read, wall - first_step_s)],
    }
