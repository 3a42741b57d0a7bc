#!/usr/bin/env bash
# FP8 target on one GPU host (docs/performance.md, "FP8 target"): the GPU tests of the FP8 path,
# the captured states' error at 8B shapes, and `bench engine` with the target in bf16 and in FP8
# taking turns (A B B A) at each batch, all in one call.
#
#   bash tests/tools/gpu_fp8.sh BIN LIBTESTS OUT [PRESET] [BATCHES]
#
# BIN: a release dflash-top; LIBTESTS: the stripped lib test binary (tests/tools/gpu_tests.sh);
# OUT: where the logs go. PRESET (qwen3-8b) and BATCHES ("1 4").
set -uo pipefail
BIN=$1 LIBTESTS=$2 OUT=$3 PRESET=${4:-qwen3-8b} BATCHES=${5:-1 4}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt"
"$LIBTESTS" fp8 target_kernels --include-ignored --test-threads 1 > "$OUT/gpu-tests.txt" 2>&1
tail -n 3 "$OUT/gpu-tests.txt"
"$BIN" bench precision --preset "$PRESET" --steps 2 --target-devices cuda:0 --drafter-devices cuda:0 > "$OUT/precision-$PRESET.txt" 2>&1
tail -n 8 "$OUT/precision-$PRESET.txt"
for b in $BATCHES; do
  steps=$(( b == 1 ? 80 : 40 ))
  for p in bf16 fp8 fp8 bf16; do
    echo "== batch $b $p" | tee -a "$OUT/abba.txt"
    "$BIN" bench engine --preset "$PRESET" --batch "$b" --target-precision "$p" \
      --steps "$steps" --cupti off --target-devices cuda:0 --drafter-devices cuda:0 2>&1 | grep -E "^(bench|config):" |
      tee -a "$OUT/abba.txt"
  done
done
