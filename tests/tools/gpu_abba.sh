#!/usr/bin/env bash
# Two builds of dflash-top taking turns (A B B A) on `bench engine` at one GPU, for a change kept
# only with its ratio measured side by side in one call:
#
#   bash tests/tools/gpu_abba.sh BIN_A BIN_B OUT NAME "bench engine flags" [LIMIT_S]
#
# Each run's whole output goes to OUT/NAME-<i>-<A|B>.txt; OUT/NAME.txt gathers the lines that
# matter (tok/s, phases, memory, which paths ran) and the summary. The target and the drafter
# share cuda:0. LIMIT_S (120) bounds each run: four of them stay inside one 600 s device call.
set -uo pipefail
A=$1 B=$2 OUT=$3 NAME=$4 FLAGS=$5 LIMIT=${6:-120}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
: > "$OUT/$NAME.txt"
i=0
for which in A B B A; do
  i=$((i + 1))
  bin=$A
  [ "$which" = B ] && bin=$B
  log="$OUT/$NAME-$i-$which.txt"
  echo "== $NAME $i $which: $bin bench engine $FLAGS" | tee -a "$OUT/$NAME.txt"
  # shellcheck disable=SC2086
  timeout "$LIMIT" "$bin" bench engine $FLAGS --target-devices cuda:0 --drafter-devices cuda:0 \
    > "$log" 2>&1
  echo "exit $?" | tee -a "$OUT/$NAME.txt"
  grep -E "^(bench: preset|bench: drafter-0|bench: memory|bench: target_precision|summary:)|out of memory" \
    "$log" | cut -c1-400 | tee -a "$OUT/$NAME.txt"
done
