#!/bin/bash
# Activation recomputation (training.recompute, docs/trainer.md "Recomputation"): selective and full train the
# same bits as none — every step's loss and grad_norm and the final weights — on layouts that exercise each
# path: TP×DP (fused backward), a zero-bubble pipeline with ZeRO-3 (W apart from B: recomputed again there,
# weights gathered again), interleaved chunks sharing one layer workspace, CP ring attention with sequence
# parallelism, experts (selective; full refused in one line). And the memory: tiny with 16 layers reports at
# least 3x less activation memory under full than under none, selective in between. The control: a run with
# another seed differs, so the comparison can fail.
# usage: recompute_cli.sh MESHRUN_TRAIN TEMPLATE_DIR MPIRUN
set -u
TRAIN=$1 TEMPLATES=$2 MPIRUN=$3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-recompute-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
# step, loss, grad_norm of every metrics line (the shortest round-trip text: equal text = equal bits)
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }
activations() { sed -n 's/.*; activations \([0-9.]*\) MiB;.*/\1/p' "$1" | head -1; }

# train NAME MODE TEMPLATE ARGS...: 4 ranks, 8 steps; metrics in NAME-MODE.jsonl, weights in NAME-MODE.safetensors.
train() {
  local name=$1 mode=$2 tmpl=$3; shift 3
  "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATES/$tmpl" --set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin" \
    --set training.steps=8 --set training.recompute="$mode" --metrics "$DIR/$name-$mode.jsonl" \
    --set checkpoint.save="$DIR/$name-$mode.safetensors" "$@" >"$DIR/$name-$mode.log" 2>&1
}
# same NAME MODE: MODE's run equals none's, bit for bit.
same() {
  local name=$1 mode=$2
  [[ $(numbers "$DIR/$name-none.jsonl" | wc -l) -eq 8 ]] || { bad "$name: the none run has no 8 step records"; return; }
  if diff <(numbers "$DIR/$name-none.jsonl") <(numbers "$DIR/$name-$mode.jsonl") >"$DIR/diff" &&
     cmp -s "$DIR/$name-none.safetensors" "$DIR/$name-$mode.safetensors"; then
    pass "$name: $mode = none bit for bit (8 steps' loss and grad_norm, final weights); activations $(activations "$DIR/$name-none.log") -> $(activations "$DIR/$name-$mode.log") MiB"
  else
    bad "$name: $mode differs from none"; head -4 "$DIR/diff"
  fi
}
# layout NAME TEMPLATE MODES ARGS...: none and each of MODES (comma-separated), compared.
layout() {
  local name=$1 tmpl=$2 modes=$3; shift 3
  train "$name" none "$tmpl" "$@" || { bad "$name none: exit $?"; tail -5 "$DIR/$name-none.log"; return; }
  for mode in ${modes//,/ }; do
    train "$name" "$mode" "$tmpl" "$@" || { bad "$name $mode: exit $?"; tail -5 "$DIR/$name-$mode.log"; continue; }
    same "$name" "$mode"
  done
}

layout tp2-dp2 tiny.toml selective,full
layout zb-pp2-zero3 tiny.toml selective,full --set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=zb \
  --set parallel.zero_stage=3
layout interleaved-pp2-v2 tiny.toml full --set parallel.tp=1 --set parallel.pp=2 --set parallel.virtual_stages=2 \
  --set parallel.pipeline_schedule=interleaved --set training.global_batch_size=32
layout tp2-cp2-sp tiny.toml selective,full --set parallel.cp=2 --set parallel.sequence_parallel=true
layout moe-ep2 tiny-moe.toml selective --set parallel.ep=2

# The control: another seed changes the numbers, so `same` can fail.
if ! train seed none tiny.toml --set training.seed=4321; then bad "control: exit $?"; tail -5 "$DIR/seed-none.log"
elif [[ $(numbers "$DIR/seed-none.jsonl" | wc -l) -ne 8 ]]; then bad "control: no 8 step records"
elif diff -q <(numbers "$DIR/tp2-dp2-none.jsonl") <(numbers "$DIR/seed-none.jsonl") >/dev/null; then
  bad "control: a run with another seed has the same numbers: the comparison cannot fail"
else pass "control: another seed differs (the comparison can fail)"; fi

# Memory: tiny with 16 layers.
for mode in none selective full; do
  train deep "$mode" tiny.toml --set model.layers=16 || { bad "deep $mode: exit $?"; tail -5 "$DIR/deep-$mode.log"; }
done
same deep full
n=$(activations "$DIR/deep-none.log") s=$(activations "$DIR/deep-selective.log") f=$(activations "$DIR/deep-full.log")
if python3 -c 'import sys; n, s, f = map(float, sys.argv[1:]); sys.exit(0 if n >= 3 * f and f < s < n else 1)' "$n" "$s" "$f"; then
  pass "16 layers: activations none $n, selective $s, full $f MiB (none/full $(python3 -c "print('%.2f' % ($n / $f))"), at least 3)"
else bad "16 layers: activations none $n, selective $s, full $f MiB: full is not 3x under none, or selective not between"; fi

# Full recomputation of expert layers is refused before anything starts.
expect 2 'training.recompute = "full" with model.experts' "moe full: refused in one line" -- \
  "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATES/tiny-moe.toml" --set data.text="$DIR/text" \
  --set data.text_cache="$DIR/corpus.bin" --set training.steps=1 --set training.recompute=full --no-metrics
exit $fail
