#!/usr/bin/env bash
# bf16 AdamW moments (`--optimizer-states bf16`) on one GPU host (docs/performance.md, "bf16
# optimizer states"): the GPU tests of the AdamW kernels, `bench engine` with f32 and bf16
# moments taking turns (A B B A) at PRESET, then `bench engine` at the large preset with bf16
# moments and with f32 ones (which may not fit: then that is the figure), in one call.
#
#   bash tests/tools/gpu_states.sh BIN LIBTESTS OUT [PRESET] [LARGE] [LARGE_ARGS]
#
# BIN: a release dflash-top; LIBTESTS: the stripped lib test binary (tests/tools/gpu_tests.sh);
# OUT: where the logs go. PRESET (qwen3-8b) for the turns, LARGE (qwen3-32b) run with
# LARGE_ARGS ("--target-precision fp8") and each kind of moments.
set -uo pipefail
BIN=$1 LIBTESTS=$2 OUT=$3 PRESET=${4:-qwen3-8b} LARGE=${5:-qwen3-32b}
LARGE_ARGS=${6:---target-precision fp8}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv > "$OUT/gpu.txt"
"$LIBTESTS" moments adamw fp8 --include-ignored --test-threads 1 > "$OUT/gpu-tests.txt" 2>&1
tail -n 3 "$OUT/gpu-tests.txt"
for s in f32 bf16 bf16 f32; do
  echo "== $PRESET batch 1 optimizer_states $s" | tee -a "$OUT/abba.txt"
  "$BIN" bench engine --preset "$PRESET" --batch 1 --optimizer-states "$s" --steps 80 \
    --cupti off --target-devices cuda:0 --drafter-devices cuda:0 2>&1 |
    grep -E "^(bench|config):|error|memory" | tee -a "$OUT/abba.txt"
done
for s in bf16 f32; do
  echo "== $LARGE $LARGE_ARGS optimizer_states $s" | tee -a "$OUT/$LARGE.txt"
  # shellcheck disable=SC2086
  timeout "${LARGE_LIMIT:-200}" "$BIN" bench engine --preset "$LARGE" --batch 1 $LARGE_ARGS \
    --optimizer-states "$s" --steps 40 --cupti off --target-devices cuda:0 \
    --drafter-devices cuda:0 > "$OUT/$LARGE-$s.txt" 2>&1
  echo "exit $?" | tee -a "$OUT/$LARGE.txt"
  grep -E "^(bench|summary):|out of memory" "$OUT/$LARGE-$s.txt" | cut -c1-600 | tee -a "$OUT/$LARGE.txt"
done
