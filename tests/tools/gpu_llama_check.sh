#!/usr/bin/env bash
# A Llama-family target on a GPU: a random SmolLM2-135M-shaped Llama (and a Qwen2-shaped one),
# trained a few steps with every fast path on and with the target's fast paths off; the losses
# of the same steps must agree within bf16 noise. Usage (on a GPU host, docs/gpu.md):
#   bash tests/tools/gpu_llama_check.sh BIN OUT_DIR
set -euo pipefail
BIN=$1; OUT=$2; mkdir -p "$OUT"
python3 - "$OUT" <<'PY'
import sys, torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
out = sys.argv[1]
torch.manual_seed(0)
llama = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152,
                    rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5,
                    bos_token_id=1, eos_token_id=2, pad_token_id=2, initializer_range=0.05)
LlamaForCausalLM(llama).to(torch.bfloat16).save_pretrained(f"{out}/llama")
qwen2 = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                    num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                    rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
                    eos_token_id=151645, pad_token_id=151643, initializer_range=0.05)
Qwen2ForCausalLM(qwen2).to(torch.bfloat16).save_pretrained(f"{out}/qwen2")
PY
for m in llama qwen2; do
  for mode in fast plain; do
    extra=(); [ "$mode" = plain ] && extra=(--disable target-kernels,flash-target,graphs)
    "$BIN" train --headless --target "$OUT/$m" --target-devices cuda:0 --drafter-devices cuda:0 \
      --steps 8 --seed 3 --seq-len 1024 --interval 0.2 --mask-token-id 2 "${extra[@]}" > "$OUT/$m-$mode.log" 2>&1 \
      || { echo "$m $mode failed:"; tail -5 "$OUT/$m-$mode.log"; exit 1; }
    echo "$m $mode: $(grep -m1 '^config:' "$OUT/$m-$mode.log" | cut -c1-160)"
    grep -o "step=[0-9]* loss=[0-9.]*" "$OUT/$m-$mode.log" | uniq | tr "\n" " "; echo; grep "^summary:" "$OUT/$m-$mode.log" | cut -c1-200
  done
done
