#!/bin/bash
# Wall time of `meshrun plan --format json` for 16,384 and 131,072 GPUs (median and min of N runs).
# usage: bench/plan_bench.sh [MESHRUN] [RUNS]      (from the repository root; default build/launcher/meshrun, 10)
set -euo pipefail
bin=${1:-build/launcher/meshrun}
runs=${2:-10}

measure() {
  local label=$1
  shift
  local times=()
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s%N)
    "$bin" plan --no-site "$@" --format json > /tmp/meshrun-plan-bench.json
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000 )))
  done
  local sorted
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  local min median bytes
  min=$(echo "$sorted" | head -1)
  median=$(echo "$sorted" | sed -n "$(( (runs + 1) / 2 ))p")
  bytes=$(stat -c %s /tmp/meshrun-plan-bench.json)
  awk -v l="$label" -v med="$median" -v mn="$min" -v b="$bytes" \
    'BEGIN { printf "%-44s median %8.1f ms   min %8.1f ms   output %6.1f MB\n", l, med / 1000, mn / 1000, b / 1e6 }'
}

measure "llama3-405b, 16,384 GPUs (2,048 nodes)" templates/llama3-405b.toml
measure "llama3-405b, 131,072 GPUs (16,384 nodes)" templates/llama3-405b.toml --nodes 16384 \
  --set cluster.hostlist= --set training.global_batch_size=16384
rm -f /tmp/meshrun-plan-bench.json
