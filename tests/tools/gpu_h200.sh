#!/usr/bin/env bash
# Issue 42's items that need an H200 (139 GiB), in three stages, each within one 600 s device
# call (the timeouts of a stage add up to 570 s at most):
#
#   bash tests/tools/gpu_h200.sh goals BIN OUT   # 8B batch 1 and 4: ours FP8 against SpecForge
#                                                # 0.2.0, then ours bf16; 0.6B batch 1
#   bash tests/tools/gpu_h200.sh large BIN OUT   # 32B with a bf16 target (bf16 and f32 moments),
#                                                # SpecForge at 32B
#   bash tests/tools/gpu_h200.sh long BIN OUT    # SpecForge at 8B shapes, rows of 3,072 and 16,384
#
# BIN: a release dflash-top. Needs PYTHONPATH holding dflash, specforge and pydantic (their
# wheels) and is run from the repository root. Each figure's JSON or log lands in OUT as soon as
# it is done, so a stage cut short by the call's limit keeps what finished.
set -uo pipefail
STAGE=$1 BIN=$2 OUT=$3
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/gpu-$STAGE.txt"
cat "$OUT/gpu-$STAGE.txt"
case $STAGE in
goals)
  # Ours at its best setting (FP8 target) against SpecForge as it ships, side by side, then ours
  # at its defaults (bf16 target) and 0.6B's batch 1.
  timeout 300 python3 python/peer/compare.py --bin "$BIN" \
    --configs qwen3-8b:1,qwen3-8b:4 --peers specforge --ours-args "--target-precision fp8" \
    --json "$OUT/goals-fp8-vs-specforge.json" 2>&1 | tee "$OUT/goals-fp8.log" | grep -vE '^\s*$' | tail -n 8
  timeout 150 python3 python/peer/compare.py --bin "$BIN" \
    --configs qwen3-8b:1,qwen3-8b:4,qwen3-0.6b:1 --peers none \
    --json "$OUT/goals-bf16.json" 2>&1 | tee "$OUT/goals-bf16.log" | grep -vE '^\s*$' | tail -n 8
  timeout 120 python3 python/peer/compare.py --bin "$BIN" \
    --configs qwen3-0.6b:1 --peers specforge \
    --json "$OUT/goals-0.6b-vs-specforge.json" 2>&1 | tee "$OUT/goals-0.6b.log" | grep -vE '^\s*$' | tail -n 5
  ;;
large)
  for s in bf16 f32; do
    echo "== qwen3-32b bf16 target, optimizer_states $s"
    timeout 150 "$BIN" bench engine --preset qwen3-32b --batch 1 --optimizer-states "$s" \
      --steps 30 --cupti off --target-devices cuda:0 --drafter-devices cuda:0 \
      > "$OUT/32b-bf16-target-$s.txt" 2>&1
    echo "exit $?"
    grep -E "^bench: (preset|memory|placement)|out of memory|error" \
      "$OUT/32b-bf16-target-$s.txt" | cut -c1-400
  done
  echo "== SpecForge qwen3-32b seq 3072"
  timeout 150 python3 python/peer/sf_peer.py --preset qwen3-32b --batch 1 --steps 3 \
    --warmup 1 --seq 3072 --device cuda:0 > "$OUT/sf-32b.log" 2>&1
  echo "exit $?"; tail -n 2 "$OUT/sf-32b.log" | cut -c1-400
  ;;
long)
  for seq in 3072 16384; do
    echo "== SpecForge qwen3-8b seq $seq"
    timeout 150 python3 python/peer/sf_peer.py --preset qwen3-8b --batch 1 --steps 4 \
      --warmup 2 --seq "$seq" --device cuda:0 > "$OUT/sf-8b-$seq.log" 2>&1
    echo "exit $?"; tail -n 1 "$OUT/sf-8b-$seq.log" | cut -c1-400
  done
  ;;
*)
  echo "stage: goals, large or long" >&2; exit 2 ;;
esac
