#!/bin/bash
# Trainer throughput on 1 rank (plus the 4-rank tiny demo layout for comparison) (tokens/s of full training steps: forward, backward, AdamW), for the tiny
# template and a ~100M-parameter model. Not a test; numbers are recorded in docs/trainer.md.
# usage: bench/trainer_bench.sh [BUILD_DIR]     (run from the repository root)
set -eu
BUILD=${1:-build}
TRAIN=$BUILD/trainer/meshrun-train
OUT=$(mktemp -d /tmp/meshrun-trainer-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
run() {  # NAME TEMPLATE ARGS...: median tokens/s and ms/step over the steps after the first
  local name=$1 template=$2; shift 2
  ${LAUNCH:-} "$TRAIN" "$template" --metrics "$OUT/$name.jsonl" "$@" >"$OUT/$name.log"
  local tps ms
  tps=$(grep '"record":"step"' "$OUT/$name.jsonl" | tail -n +2 | sed 's/.*"tokens_per_s":\([0-9.e+-]*\).*/\1/' | median)
  ms=$(grep '"record":"step"' "$OUT/$name.jsonl" | tail -n +2 | sed 's/.*"ms_per_step":\([0-9.e+-]*\).*/\1/' | median)
  printf '%-10s %s\n' "$name" "$(grep -o '[0-9]* parameters' "$OUT/$name.log")"
  printf '%-10s %.0f tokens/s, %.1f ms/step (median of %d steps after the first)\n' "$name" "$tps" "$ms" \
    "$(($(grep -c '"record":"step"' "$OUT/$name.jsonl") - 1))"
}
ONE=(--set parallel.tp=1 --set parallel.dp=1)
run tiny templates/tiny.toml "${ONE[@]}" --set training.steps=11
run 100m bench/trainer-100m.toml "${ONE[@]}"
# For comparison, the demo layout itself: TP 2 x DP 2, ZeRO-1 on 4 ranks (all cores of this machine).
LAUNCH="mpirun --oversubscribe --allow-run-as-root -np 4" run tiny-4rank templates/tiny.toml --set training.steps=11
