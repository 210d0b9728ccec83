#!/bin/bash
# What meshrun-train --trace costs (docs/trainer.md, "Timelines"). Not a test; numbers are recorded in the docs
# with the load average of the run. tiny at pp 2 (tp 1, dp 2: 4 ranks, the trace test's layout; RANKS=2: dp 1),
# STEPS steps (default 24),
# run PAIRS times in interleaved order:
#   off  NEW_TRAIN without --trace,
#   on   NEW_TRAIN --trace DIR --trace-steps STEPS (every step recorded; the files are written after the last),
#   base BASE_TRAIN (optional: a build from before tracing existed) without --trace.
# Each run gives the median ms_per_step of its --metrics lines after the first; the script prints, per arm,
# the median over the runs, and the median of the per-pair ratios on/off and off/base (1.000: no difference).
# Interleaving makes load from other processes hit the arms alike; the load average is printed anyway.
# usage: bench/trace_bench.sh [BUILD_DIR] [PAIRS] [BASE_TRAIN]   (from the repository root; defaults: build 7)
# Per-pair ratios scatter widely where 4 ranks share 2 cores: the quartiles of the ratios are printed too.
set -eu
BUILD=${1:-build}
PAIRS=${2:-7}
BASE=${3:-}
STEPS=${STEPS:-24}  # steps per run (the environment may set it, at most 50: every step of the "on" runs is traced)
NEW=$BUILD/trainer/meshrun-train
[ -x "$NEW" ] || { echo "trace_bench: $NEW is not built (cmake --build $BUILD --target meshrun-train)" >&2; exit 2; }
[ -z "$BASE" ] || [ -x "$BASE" ] || { echo "trace_bench: BASE_TRAIN $BASE is not an executable" >&2; exit 2; }
[[ $PAIRS =~ ^[1-9][0-9]*$ ]] || { echo "trace_bench: PAIRS must be a positive integer" >&2; exit 2; }
[ -f templates/tiny.toml ] || { echo "trace_bench: run from the repository root" >&2; exit 2; }
OUT=$(mktemp -d /tmp/meshrun-trace-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
RANKS=${RANKS:-4}   # 4: pp 2 × dp 2 (two ranks per core here); 2: pp 2 × dp 1 (one per core), global batch 8
[ "$RANKS" = 4 ] || [ "$RANKS" = 2 ] || { echo "trace_bench: RANKS must be 4 or 2" >&2; exit 2; }
MPI=(mpirun --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1 -np "$RANKS")
ARGS=(templates/tiny.toml --no-site --set parallel.tp=1 --set parallel.pp=2 --set training.steps=$STEPS
      --set data.text_cache="$BUILD/data/tiny-corpus.bin")
[ "$RANKS" = 4 ] || ARGS+=(--set training.global_batch_size=8)
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
quartiles() { sort -g | awk '{ a[NR] = $1 } END { printf "%.3f-%.3f", a[int((NR + 3) / 4)], a[int((3 * NR + 3) / 4)] }'; }
step_ms() {  # NAME BINARY EXTRA...: the median ms_per_step after the first step
  local name=$1 bin=$2; shift 2
  "${MPI[@]}" "$bin" "${ARGS[@]}" --metrics "$OUT/$name.jsonl" "$@" >"$OUT/$name.log" 2>&1 ||
    { echo "trace_bench: $bin failed:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  grep '"record":"step"' "$OUT/$name.jsonl" | tail -n +2 | grep -o '"ms_per_step":[0-9.e+-]*' | cut -d: -f2 | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores; $PAIRS pairs of $STEPS steps on $RANKS ranks"
offs=() ons=() bases=() r_on=() r_base=()
for ((p = 0; p < PAIRS; p++)); do
  rm -rf "$OUT/trace"
  if [ -n "$BASE" ]; then b=$(step_ms base "$BASE"); bases+=("$b"); fi
  a=$(step_ms off "$NEW")
  t=$(step_ms on "$NEW" --trace "$OUT/trace" --trace-steps $STEPS)
  [ -s "$OUT/trace/trace.json" ] || { echo "trace_bench: the traced run wrote no trace.json" >&2; exit 1; }
  offs+=("$a"); ons+=("$t"); r_on+=("$(ratio "$t" "$a")")
  if [ -n "$BASE" ]; then r_base+=("$(ratio "$a" "$b")"); fi
done
printf 'off   %7.2f ms/step (median of %d runs)\n' "$(printf '%s\n' "${offs[@]}" | median)" "$PAIRS"
printf 'on    %7.2f ms/step, trace.json %s bytes for %d steps\n' "$(printf '%s\n' "${ons[@]}" | median)" \
  "$(stat -c %s "$OUT/trace/trace.json")" "$STEPS"
printf 'on/off   %s (quartiles %s; pairs: %s)\n' "$(printf '%s\n' "${r_on[@]}" | median | awk '{ printf "%.3f", $1 }')" \
  "$(printf '%s\n' "${r_on[@]}" | quartiles)" "${r_on[*]}"
if [ -n "$BASE" ]; then
  printf 'base  %7.2f ms/step (%s)\n' "$(printf '%s\n' "${bases[@]}" | median)" "$BASE"
  printf 'off/base %s (quartiles %s; pairs: %s)\n' "$(printf '%s\n' "${r_base[@]}" | median | awk '{ printf "%.3f", $1 }')" \
    "$(printf '%s\n' "${r_base[@]}" | quartiles)" "${r_base[*]}"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
