#!/bin/bash
# Mixture of experts through the executables: the parameter count agrees with the planner's, tiny-moe
# trains with expert parallelism (loss falls, MoE metrics present), a Mixtral-named safetensors export
# imports on another EP layout and exports again bit for bit, and unusable MoE settings exit 2 with one line.
# usage: moe_cli_test.sh MESHRUN_TRAIN MESHRUN TEMPLATES_DIR MPIRUN
set -u
TRAIN=$1 MESHRUN=$2 TEMPLATES=$3 MPIRUN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-moe-cli-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"

# 1. Parameter count: meshrun-train's table (count-only, allocates nothing) vs meshrun plan --estimate.
for t in mixtral-8x7b llama3-8b; do
  mine=$("$TRAIN" "$TEMPLATES/$t.toml" --count-params 2>&1)
  plan=$("$MESHRUN" plan "$TEMPLATES/$t.toml" --estimate --format json 2>/dev/null | grep -o '"params_total": *[0-9]*' | grep -o '[0-9]*$')
  if [[ -n $mine && "$mine" == "$plan" ]]; then pass "$t: --count-params $mine = meshrun plan's params_total";
  else bad "$t: --count-params '$mine' vs meshrun plan's params_total '$plan'"; fi
done

# 2. tiny-moe: DP 4 x EP 4 on 4 ranks, 20 steps; the loss falls and the MoE metrics are there.
expect 0 "expert tokens max" "tiny-moe trains on 4 ranks with ep = 4" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATES/tiny-moe.toml" \
  --set data.text=/usr/share/common-licenses --set data.text_cache="$DIR/corpus.bin" --set training.steps=20 \
  --set checkpoint.save="$DIR/a.safetensors" --metrics "$DIR/m.jsonl"
for key in aux_loss expert_tokens_max expert_tokens_mean a2a_bytes; do
  grep -q "\"$key\":" "$DIR/m.jsonl" && pass "metrics have \"$key\"" || bad "metrics lack \"$key\""
done
first=$(sed -n '/"record":"step"/{s/.*"loss":\([0-9.e+-]*\).*/\1/p;q}' "$DIR/m.jsonl")
last=$(tail -1 "$DIR/m.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\).*/\1/')
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then pass "loss falls visibly ($first -> $last)";
else bad "loss did not fall by 1.0 ($first -> $last)"; fi
grep -q 'block_sparse_moe.experts.7.w2.weight' "$DIR/a.safetensors" && pass "the export has Mixtral names" \
  || bad "the export lacks model.layers.*.block_sparse_moe.experts.7.w2.weight"

# 3. Import on another layout (dp 2 x ep 2, ZeRO-3) and export again without a step: identical bytes.
expect 0 "" "import on dp 2 x ep 2, ZeRO-3, export again" -- "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATES/tiny-moe.toml" \
  --set data.path="$DIR/corpus.bin" --set parallel.ep=2 --set parallel.zero_stage=3 --set training.steps=0 \
  --set checkpoint.load="$DIR/a.safetensors" --set checkpoint.save="$DIR/b.safetensors"
grep -q "layout tp=1 cp=1 pp=1 dp=2 ep=2 zero=3" "$DIR/out" && pass "the header names every axis (ep = 2)" || bad "header: $(grep layout "$DIR/out")"
cmp -s "$DIR/a.safetensors" "$DIR/b.safetensors" && pass "export -> import -> export: identical bits" \
  || bad "the re-exported file differs from the original"

# 4. Unusable MoE settings: one line, exit 2.
expect 2 "not divisible by ep" "experts not divisible by ep" -- "${MPI[@]}" -np 4 "$TRAIN" \
  "$TEMPLATES/tiny-moe.toml" --set data.path="$DIR/corpus.bin" --set model.experts=6
expect 2 "needs a mixture-of-experts model" "ep > 1 on a dense model" -- "${MPI[@]}" -np 4 "$TRAIN" \
  "$TEMPLATES/tiny-moe.toml" --set data.path="$DIR/corpus.bin" --set model.experts=0
exit $fail
