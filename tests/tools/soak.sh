#!/usr/bin/env bash
# Soak (issue 14): N steps of the tiny preset with the TUI in tmux and --record on; samples the
# process's resident memory and the recording's size every INTERVAL seconds.
#   bash tests/tools/soak.sh [STEPS=10000] [INTERVAL=30]    (uses target/release/dflash-top)
set -u
STEPS=${1:-10000}
INTERVAL=${2:-30}
BIN=${BIN:-target/release/dflash-top}
OUT=$(mktemp -d)
REC=$OUT/soak.rec
tmux -L soak kill-server 2>/dev/null
tmux -L soak new-session -d -s soak -x 160 -y 45 \
    "$BIN train --steps $STEPS --record $REC --save-dir $OUT/ckpt; sleep 2"
sleep 2
PID=$(pgrep -n -f "dflash-top train --steps $STEPS --record $REC")
echo "pid=$PID out=$OUT"
echo "seconds rss_mib recording_kib step"
T0=$SECONDS
while kill -0 "$PID" 2>/dev/null; do
    RSS=$(awk '/VmRSS/ {print $2}' /proc/$PID/status 2>/dev/null)
    SIZE=$(( $(stat -c %s "$REC" 2>/dev/null || echo 0) / 1024 ))
    STEP=$(tmux -L soak capture-pane -t soak -p 2>/dev/null | grep -o 'step [0-9]*' | head -1)
    [ -n "$RSS" ] && echo "$((SECONDS - T0)) $((RSS / 1024)) $SIZE ${STEP:-?}"
    # A finished run keeps its screen until q: leave once the final checkpoint is there.
    if ls "$OUT/ckpt" 2>/dev/null | grep -q "^step-0*$STEPS$"; then
        sleep 2
        tmux -L soak send-keys -t soak q
    fi
    sleep "$INTERVAL"
done
echo "finished after $((SECONDS - T0)) s; recording $(( $(stat -c %s "$REC") / 1024 )) KiB"
tmux -L soak kill-server 2>/dev/null
