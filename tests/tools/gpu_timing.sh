#!/usr/bin/env bash
# The GPU checks behind the timing figures in docs/gpu.md (issue 8), run on an H200 host from the
# repository root with the release binary in .gpu/ (and, for the screenshot, a tmux in .gpu/):
#   bash tests/tools/gpu_timing.sh OUT_DIR
# 1. doctor; 2. a short run in the default (events) mode; 3. async / events / sync side by side,
# drafter on its own GPU; 4. profiling on vs off; 5. the modes with both workers on one GPU;
# 6. the TUI in events mode at 8B shapes, captured from tmux.
set -u
OUT=${1:-/tmp/gpu-out}
mkdir -p "$OUT"
BIN=${BIN:-.gpu/dflash-top}
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
export LD_LIBRARY_PATH=$TL
NGPU=$(nvidia-smi -L | wc -l)
D2=cuda:0
[ "$NGPU" -ge 2 ] && D2=cuda:1
step() { # name timeout command...
    local name=$1 t=$2
    shift 2
    local t0=$SECONDS
    timeout "$t" "$@" >"$OUT/$name.txt" 2>&1
    echo "$name rc=$? ${SECONDS}s-$t0" | tee -a "$OUT/steps.txt"
}
step doctor 60 "$BIN" doctor
step smoke-0.6b 90 "$BIN" bench engine --preset qwen3-0.6b --target-devices cuda:0 --drafter-devices cuda:0 --steps 40
step modes-8b-split 170 "$BIN" bench modes --preset qwen3-8b --target-devices cuda:0 --drafter-devices "$D2" --segment 8 --rounds 2
step profiling-8b-split 120 "$BIN" bench profiling --preset qwen3-8b --target-devices cuda:0 --drafter-devices "$D2" --segment 8 --rounds 2
step modes-8b-shared 100 "$BIN" bench modes --preset qwen3-8b --target-devices cuda:0 --drafter-devices cuda:0 --segment 6 --rounds 1
if [ -x .gpu/tmux ]; then
    export LD_LIBRARY_PATH=$PWD/.gpu/lib:$TL
    T=".gpu/tmux -S $OUT/tmux.sock"
    $T new-session -d -s gpu -x 160 -y 45 "$BIN train --preset qwen3-8b --target-devices cuda:0 --drafter-devices $D2"
    sleep 30
    $T capture-pane -t gpu -e -p >"$OUT/tui-overview.ansi"
    $T send-keys -t gpu 3
    sleep 2
    $T capture-pane -t gpu -e -p >"$OUT/tui-phases.ansi"
    $T send-keys -t gpu q
    sleep 5
    $T kill-server 2>/dev/null
    rm -f "$OUT/tmux.sock"
    echo "tui done" | tee -a "$OUT/steps.txt"
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
