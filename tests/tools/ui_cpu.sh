#!/usr/bin/env bash
# CPU share of the front-end threads (the UI loop on the main thread, and ui-input) during a
# live run at 10 frames a second: `bash tests/tools/ui_cpu.sh [seconds]`; `VIEW=6` measures with
# that view open (6: the timeline). Needs tmux.
set -eu
secs=${1:-10}
bin=${BIN:-target/release/dflash-top}
tmux new-session -d -s uicpu -x 120 -y 36 "$bin"
trap 'tmux kill-session -t uicpu 2>/dev/null' EXIT
sleep 4
if [ -n "${VIEW:-}" ]; then tmux send-keys -t uicpu "$VIEW"; sleep 1; fi
pid=$(pgrep -f "^$bin" | head -1)
ticks() { # utime+stime of a thread, in clock ticks
  awk '{print $14+$15}' "/proc/$pid/task/$1/stat"
}
input=$(grep -l '^ui-input$' /proc/$pid/task/*/comm | head -1 | xargs dirname | xargs basename)
a0=$(ticks "$pid"); b0=$(ticks "$input")
sleep "$secs"
a1=$(ticks "$pid"); b1=$(ticks "$input")
hz=$(getconf CLK_TCK)
awk -v a=$((a1 - a0)) -v b=$((b1 - b0)) -v s="$secs" -v hz="$hz" 'BEGIN {
  printf "ui loop (main thread): %.2f%% of one core\nui-input thread:       %.2f%% of one core\n", 100*a/hz/s, 100*b/hz/s }'
