#!/bin/sh
# Long rows at Qwen3-8B shapes on one GPU (issue 42): dflash-top's `bench engine` through
# python/peer/compare.py at each length, then SpecForge 0.2.0's step (python/peer/sf_peer.py) at
# the lengths given, each in its own time limit, each row's JSON written as soon as it is done
# (a length that runs out of memory or time still leaves the others).
#
#   sh tests/tools/gpu_long_seq.sh BIN OUT_DIR "32768 8192 3072 16384" "8192"
#
# Needs PYTHONPATH holding dflash, specforge and pydantic, and LD_LIBRARY_PATH the host's torch
# libraries (docs/gpu.md). Plot: python/peer/plot_seq.py OUT.png OUT_DIR/ours-*.json.
set -u
BIN=$1 OUT=$2 OURS=$3 SF=$4
PRESET=${PRESET:-qwen3-8b}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1
for seq in $OURS; do
    echo "== dflash-top $PRESET seq $seq"
    timeout "${OURS_LIMIT:-75}" python3 python/peer/compare.py --bin "$BIN" \
        --configs "$PRESET:1:$seq" --peers none --json "$OUT/ours-$seq.json" \
        || echo "dflash-top seq $seq: exit $?"
done
for seq in $SF; do
    echo "== SpecForge $PRESET seq $seq"
    timeout "${SF_LIMIT:-100}" python3 python/peer/sf_peer.py --preset "$PRESET" --batch 1 \
        --steps 4 --warmup 2 --seq "$seq" --device cuda:0 > "$OUT/sf-$seq.log" 2>&1
    echo "SpecForge seq $seq: exit $?"
    tail -n 1 "$OUT/sf-$seq.log"
done
