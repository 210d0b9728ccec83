#!/bin/bash
# Checkpoint save and restore cost (not a test; numbers are recorded in docs/trainer.md): tiny on 4 ranks
# (TP 2 × DP 2, ZeRO-1) and the 100.7M-parameter configuration on 1 rank, both fp32. Each: one training step,
# then the end-of-run save (seconds and bytes as meshrun-train logs them after the commit), then a run that
# resumes from it (load seconds, max over ranks); bytes per rank from the shard files.
# usage: bench/checkpoint_bench.sh [BUILD_DIR]     (run from the repository root)
set -eu
BUILD=${1:-build}
TRAIN=$BUILD/trainer/meshrun-train
OUT=$(mktemp -d /tmp/meshrun-ckpt-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
run() {  # NAME TEMPLATE ARGS...
  local name=$1 template=$2; shift 2
  ${LAUNCH:-} "$TRAIN" "$template" --set training.steps=1 --set checkpoint.dir="$OUT/$name" "$@" >"$OUT/$name.save.log"
  ${LAUNCH:-} "$TRAIN" "$template" --set training.steps=1 --set checkpoint.dir="$OUT/$name" "$@" >"$OUT/$name.load.log"
  local save load files
  save=$(sed -n 's/.*checkpoint committed: .* (\([0-9]* shards, [0-9.]* MiB, [0-9.]* s\)).*/\1/p' "$OUT/$name.save.log")
  load=$(sed -n 's/.*loaded in \([0-9.]* s\).*/\1/p' "$OUT/$name.load.log")
  files=$(stat -c '%s' "$OUT/$name"/step-1/rank-*.safetensors | awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.2f MiB max per rank", m / 1048576 }')
  printf '%-10s save: %s; %s; restore: %s\n' "$name" "$save" "$files" "$load"
}
LAUNCH="mpirun --oversubscribe --allow-run-as-root -np 4" run tiny templates/tiny.toml
run 100m bench/trainer-100m.toml --set parallel.tp=1 --set parallel.dp=1
