#!/bin/bash
# Two meshrun-train binaries against each other (CPU speed regression check, issue 25): the training step
# of bench/cpu_bench.sh's section 2 at the tiny and the mid size (same templates, flags, step counts and
# data, one rank, OMP_NUM_THREADS=1), OLD then NEW, PAIRS times. Each run gives the median ms_per_step of
# its --metrics lines after the first; per size the script prints the median of OLD, of NEW and of the
# per-pair ratios NEW / OLD (< 1: NEW faster), and whether that ratio is <= 1.05 (the issue's bar).
# Interleaving makes load from other processes hit both sides alike; the load average is printed anyway.
# usage: bench/ab_step_time.sh OLD_TRAIN NEW_TRAIN [PAIRS]   (run from the repository root; PAIRS: 5)
#   e.g. git worktree add --detach ../base f3355c0, build its meshrun-train as scripts/build does, then
#        bench/ab_step_time.sh ../base/build/trainer/meshrun-train build/trainer/meshrun-train
# Exit status: 0 all sizes <= 1.05, 3 some size above, 2 bad arguments, 1 a run failed.
# Both binaries take the same CLI (--set, --metrics; ms_per_step in every metrics line) back to the
# first commit; a binary whose metrics lack ms_per_step stops the script with a message.
set -eu
usage="usage: bench/ab_step_time.sh OLD_TRAIN NEW_TRAIN [PAIRS]  (from the repository root)"
{ [ $# -ge 2 ] && [ $# -le 3 ]; } || { echo "ab_step_time: $usage" >&2; exit 2; }
OLD=$1 NEW=$2 PAIRS=${3:-5}
for b in "$OLD" "$NEW"; do
  { [ -f "$b" ] && [ -x "$b" ]; } || { echo "ab_step_time: $b is not an executable meshrun-train; $usage" >&2; exit 2; }
done
[[ $PAIRS =~ ^[1-9][0-9]*$ ]] || { echo "ab_step_time: PAIRS must be a positive integer, not '$PAIRS'" >&2; exit 2; }
{ [ -f templates/tiny.toml ] && [ -f bench/trainer-mid.toml ]; } ||
  { echo "ab_step_time: run from the repository root (templates/tiny.toml, bench/trainer-mid.toml)" >&2; exit 2; }
OUT=$(mktemp -d /tmp/meshrun-ab-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
describe() {  # BINARY: path, the source tree its build dir was configured from, that tree's git describe
  local cache src
  cache=$(dirname "$(dirname "$(readlink -f "$1")")")/CMakeCache.txt
  src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache" 2>/dev/null || true)
  echo "$(readlink -f "$1") (built $(date -u -r "$1" '+%F %T') UTC; source ${src:-?}:" \
    "$( [ -n "$src" ] && git -C "$src" describe --always --dirty 2>/dev/null || echo '?'))"
}
echo "old: $(describe "$OLD")"
echo "new: $(describe "$NEW")"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# Median ms per step of one run over the steps after the first (cpu_bench.sh's train_ms).
train_ms() {  # BINARY NAME ARGS...
  local bin=$1 name=$2 ms; shift 2
  OMP_NUM_THREADS=1 "$bin" "$@" --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1 ||
    { echo "ab_step_time: $bin failed:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  ms=$(grep '"record":"step"' "$OUT/$name.jsonl" | tail -n +2 | grep -o '"ms_per_step":[0-9.e+-]*' | cut -d: -f2 | median)
  [ -n "$ms" ] || { echo "ab_step_time: no ms_per_step in $bin's metrics after step 1" >&2; exit 1; }
  echo "$ms"
}
ONE=(--set parallel.tp=1 --set parallel.dp=1 --set parallel.zero_stage=0)
status=0
ab() {  # NAME TOML STEPS, as cpu_bench.sh's step_pairs (the first run tokenizes build/data/tiny-corpus.bin)
  local name=$1 toml=$2 steps=$3 a b p olds=() news=() ratios=()
  for ((p = 0; p < PAIRS; p++)); do
    a=$(train_ms "$OLD" "$name-old" "$toml" "${ONE[@]}" --set training.steps="$steps")
    b=$(train_ms "$NEW" "$name-new" "$toml" "${ONE[@]}" --set training.steps="$steps")
    olds+=("$a"); news+=("$b"); ratios+=("$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b / a }')")
  done
  local r
  r=$(printf '%s\n' "${ratios[@]}" | median | awk '{ printf "%.3f", $1 }')
  printf '%-5s old %8.1f ms/step, new %8.1f ms/step, new/old %s (pairs: %s)\n' "$name" \
    "$(printf '%s\n' "${olds[@]}" | median)" "$(printf '%s\n' "${news[@]}" | median)" "$r" "${ratios[*]}"
  if awk -v r="$r" 'BEGIN { exit !(r <= 1.05) }'; then printf '%-5s new/old %s <= 1.05: yes\n' "$name" "$r"
  else printf '%-5s new/old %s <= 1.05: NO (regression)\n' "$name" "$r"; status=3; fi
}
ab tiny templates/tiny.toml 6
ab mid bench/trainer-mid.toml 4
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
