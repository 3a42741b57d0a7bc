"""Reference numbers for Llama-family targets: a tiny random transformers LlamaForCausalLM (tied
embeddings, GQA, rope_theta 50000 with llama3 RoPE scaling, MLP biases) and a tiny random
Qwen2ForCausalLM (q/k/v biases, rope_theta 25000), saved as Hugging Face directories with their
hidden states on a packed batch and their next-token logits after a prompt.

make_reference.py calls `make(OUT)`; it writes, for NAME in llama and qwen2:
OUT/NAME/target/ and OUT/NAME/reference.safetensors:
- `packed.input_ids`, `packed.positions`, `packed.doc_ids` [2, 24]: two rows of documents
  (positions restart in each), `packed.hidden` [2, 24, 3 * H]: the outputs of decoder layers
  `CAPTURE`, each document run alone (what causal attention within a document gives);
- `prompt` [1, 12] and `logits` [1, VOCAB]: the logits after the prompt's last token;
- `input_ids`, `positions`, `target_hidden` (layers 1 and 3), `block_ids`, `block_pos`, `mask`:
  one sequence and three blocks of 4, the inputs check_checkpoint.py runs a drafter on (a
  2-layer drafter of block 4 trained on this target reads layers 1 and 3).
The random biases are drawn here (transformers starts them at 0, which would test nothing).
"""
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

H, L, VOCAB, MASK, BLOCK = 64, 6, 256, 255, 4
CAPTURE = [0, 2, 4]  # not the last: transformers returns it after the final norm
DRAFTER_LAYERS = [1, 3]

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=H,
    intermediate_size=128,
    num_hidden_layers=L,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=512,
    initializer_range=0.2,
)

MODELS = {
    "llama": lambda: LlamaForCausalLM(
        LlamaConfig(
            tie_word_embeddings=True,
            mlp_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            **COMMON,
        )
    ),
    "qwen2": lambda: Qwen2ForCausalLM(
        Qwen2Config(
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 25000.0},
            **COMMON,
        )
    ),
}


def hidden_of(model, ids, positions, layers):
    with torch.no_grad():
        hs = model(ids, position_ids=positions, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layers], dim=-1)


def make_one(out, name, seed):
    torch.manual_seed(seed)
    model = MODELS[name]().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.2)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(os.path.join(out, name, "target"), safe_serialization=True)

    # A packed batch: documents of these lengths, each row filled to 24 tokens.
    lengths = [[10, 9, 5], [14, 6, 4]]
    S = 24
    ids = torch.randint(0, MASK, (2, S))
    doc_ids = torch.stack(
        [torch.repeat_interleave(torch.arange(len(l)), torch.tensor(l)) for l in lengths]
    )
    positions = torch.stack([torch.cat([torch.arange(n) for n in l]) for l in lengths])
    rows = []
    for r, l in enumerate(lengths):
        parts, start = [], 0
        for n in l:
            piece = ids[r : r + 1, start : start + n]
            parts.append(hidden_of(model, piece, torch.arange(n)[None], CAPTURE))
            start += n
        rows.append(torch.cat(parts, dim=1))
    packed_hidden = torch.cat(rows, dim=0)

    prompt = torch.randint(0, MASK, (1, 12))
    with torch.no_grad():
        logits = model(prompt).logits[:, -1].float()

    # One sequence and three blocks for a drafter trained on this target (check_checkpoint.py).
    seq = torch.randint(0, MASK, (1, S))
    seq_pos = torch.arange(S)[None]
    target_hidden = hidden_of(model, seq, seq_pos, DRAFTER_LAYERS)
    anchors = torch.tensor([0, 7, 15])
    A = len(anchors)
    block_ids = torch.full((1, A, BLOCK), MASK)
    block_ids[0, :, 0] = seq[0, anchors]
    block_pos = (anchors[:, None] + torch.arange(BLOCK)).view(1, A * BLOCK)
    q_block = torch.arange(A).repeat_interleave(BLOCK)
    ctx = torch.arange(S)[None, :] < anchors.repeat_interleave(BLOCK)[:, None]
    own = q_block[:, None] == q_block[None, :]
    mask = torch.cat([ctx, own], dim=1)[None, None]

    save_file(
        {
            "packed.input_ids": ids.contiguous(),
            "packed.positions": positions.contiguous(),
            "packed.doc_ids": doc_ids.contiguous(),
            "packed.hidden": packed_hidden.contiguous(),
            "prompt": prompt.contiguous(),
            "logits": logits.contiguous(),
            "input_ids": seq.contiguous(),
            "positions": seq_pos.contiguous(),
            "target_hidden": target_hidden.contiguous(),
            "block_ids": block_ids.view(1, A * BLOCK).contiguous(),
            "block_pos": block_pos.contiguous(),
            "mask": mask.contiguous(),
        },
        os.path.join(out, name, "reference.safetensors"),
    )


def make(out):
    for seed, name in enumerate(MODELS):
        make_one(out, name, 10 + seed)
    print(f"llama-family references written to {out}/llama, {out}/qwen2")
