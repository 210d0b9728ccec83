#!/bin/bash
# Bridges (issue 27): the flags `meshrun plan --for megatron|torchtitan` prints make the framework build the
# groups of meshrun's map. tests/launcher/bridges_check.py re-implements each framework's rank rules from its
# own source and compares them with `meshrun plan --format json` for 8 Megatron layouts (interleaved and EP
# among them) and 4 torchtitan layouts; layouts a framework cannot express are refused in one line; `meshrun
# exec --for` appends the same words to the command and refuses a command that already sets one differently.
# usage: bridges.sh   (MESHRUN, SRC from ctest)
set -u
M=$MESHRUN
T=$SRC/templates
CHECK=$SRC/tests/launcher/bridges_check.py
DIR=$(mktemp -d /tmp/meshrun-bridges-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail=0
pass() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

# same FRAMEWORK NAME ARGS...: the framework's groups from our flags equal meshrun's groups
same() {
  local fw=$1 name=$2; shift 2
  local flags out
  if ! flags=$("$M" plan "$@" --for "$fw" 2>"$DIR/err"); then bad "$fw $name: refused: $(cat "$DIR/err")"; return; fi
  "$M" plan "$@" --format json --all >"$DIR/plan.json" 2>"$DIR/err" || { bad "$fw $name: plan --format json: $(cat "$DIR/err")"; return; }
  # shellcheck disable=SC2086  # the flags are plain words
  if out=$(python3 "$CHECK" "$fw" "$DIR/plan.json" $flags); then pass "$fw $name: $out"
  else bad "$fw $name: groups differ: $out"; echo "     | flags: $flags"; fi
}
N2=(--nodes 2 --gpus-per-node 8)
same megatron "tiny tp2 dp2" "$T/tiny.toml"
same megatron "tp2 cp2 pp2 dp2, 16 GPUs" "$T/tiny.toml" "${N2[@]}" --set parallel.cp=2 --set parallel.pp=2 --set training.seq_len=256
same megatron "tp2 cp2 pp2 dp2, tp-cp-ep-pp-dp" "$T/tiny.toml" "${N2[@]}" --set parallel.cp=2 --set parallel.pp=2 \
  --set training.seq_len=256 --set parallel.order=tp-cp-ep-pp-dp
same megatron "interleaved pp4 v2 tp2 dp2" "$T/tiny.toml" "${N2[@]}" --set parallel.pp=4 --set parallel.pipeline_schedule=interleaved \
  --set parallel.virtual_stages=2 --set training.global_batch_size=32 --set model.layers=8
same megatron "mixtral tp2 pp4 ep4 dp8" "$T/mixtral-8x7b.toml"
same megatron "tiny-moe tp2 cp2 ep2 pp2 dp2, tp-cp-ep-pp-dp" "$T/tiny-moe.toml" "${N2[@]}" --set parallel.tp=2 --set parallel.cp=2 \
  --set parallel.ep=2 --set parallel.pp=2 --set parallel.order=tp-cp-ep-pp-dp --set training.seq_len=128 --set training.micro_batch_size=1
same megatron "tiny-moe dp4 ep4" "$T/tiny-moe.toml"
same megatron "llama3-405b, 16,384 GPUs (recompute full)" "$T/llama3-405b.toml" --set training.recompute=full
same megatron "tp1 cp4 alltoall+ring (groups of 2) pp2 dp2, 16 GPUs" "$T/tiny.toml" "${N2[@]}" --set parallel.tp=1 \
  --set parallel.cp=4 --set parallel.pp=2 --set training.seq_len=256 --set parallel.cp_comm=alltoall+ring --set parallel.cp_alltoall=2
same torchtitan "tiny tp2 dp2 DDP" "$T/tiny.toml" --set parallel.zero_stage=0
same torchtitan "tp2 cp2 pp2 dp2 FSDP" "$T/tiny.toml" "${N2[@]}" --set parallel.cp=2 --set parallel.pp=2 --set training.seq_len=256 \
  --set parallel.zero_stage=3
same torchtitan "interleaved pp4 v2 dp4 zero2" "$T/tiny.toml" "${N2[@]}" --set parallel.tp=1 --set parallel.pp=4 \
  --set parallel.pipeline_schedule=interleaved --set parallel.virtual_stages=2 --set training.global_batch_size=32 \
  --set training.micro_batch_size=1 --set model.layers=8 --set parallel.zero_stage=2
same torchtitan "tiny-moe dp4 ep4 FSDP" "$T/tiny-moe.toml" --set parallel.zero_stage=3

# The check can fail: a wrong flag (tp 4 for a tp 2 map) is told apart.
"$M" plan "$T/tiny.toml" --format json --all >"$DIR/plan.json"
python3 "$CHECK" megatron "$DIR/plan.json" --tensor-model-parallel-size 4 >/dev/null &&
  bad "a wrong tensor-parallel size matched" || pass "a wrong flag is told apart by the checker"
python3 "$CHECK" megatron "$DIR/plan.json" --tensor-model-parallel-size 2 --use-tp-pp-dp-mapping --pipeline-model-parallel-size 1 >/dev/null &&
  pass "(pp = 1: both orders give the same groups)" || true
"$M" plan "$T/tiny.toml" "${N2[@]}" --set parallel.pp=2 --set training.micro_batch_size=1 --format json --all >"$DIR/plan.json"
python3 "$CHECK" megatron "$DIR/plan.json" --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --use-tp-pp-dp-mapping >/dev/null &&
  bad "the other rank order matched" || pass "the other Megatron rank order is told apart"

# refused NAME PATTERN ARGS...: exit 2, one line
refused() {
  local name=$1 want=$2; shift 2
  "$M" plan "$@" >"$DIR/out" 2>"$DIR/err"; local rc=$?
  if [[ $rc -eq 2 && ! -s $DIR/out && $(wc -l <"$DIR/err") -eq 1 ]] && grep -q -- "$want" "$DIR/err"; then pass "$name: $(cat "$DIR/err")"
  else bad "$name: exit $rc, stderr: $(cat "$DIR/err")"; fi
}
refused "megatron, an order it cannot build" "builds its groups in the order tp-cp-ep-dp-pp (its default) or tp-cp-ep-pp-dp" \
  "$T/tiny.toml" --set parallel.order=tp-dp-cp-ep-pp --for megatron
refused "megatron, tp-cp-ep-pp-dp with unequal dense and expert DP" "needs the expert data-parallel size equal to the dense one" \
  "$T/mixtral-8x7b.toml" --set parallel.order=tp-cp-ep-pp-dp --for megatron
refused "megatron, zero-bubble" "Megatron-LM runs 1F1B and interleaved 1F1B pipelines" "$T/tiny.toml" --set parallel.pp=2 \
  --set parallel.pipeline_schedule=zb --set parallel.tp=1 --for megatron
refused "megatron, a V schedule" "a V of two chunks per rank, which Megatron-Core's interleaving does not place" \
  "$T/tiny.toml" --set parallel.pp=2 --set parallel.pipeline_schedule=zbv --set parallel.tp=1 --for megatron
# V schedules as torch.distributed.pipelining's: two stages per rank, layers per stage = layers / (2 pp).
for pair in zbv:ZBVZeroBubble dualpipev:DualPipeV; do
  out=$("$M" plan "$T/tiny.toml" --set parallel.pp=2 --set parallel.tp=1 --set parallel.zero_stage=0 \
    --set training.micro_batch_size=2 --set parallel.pipeline_schedule=${pair%%:*} --for torchtitan 2>&1)
  [[ $out == *"--parallelism.pipeline_parallel_schedule ${pair#*:} --parallelism.pipeline_parallel_layers_per_stage 1 --parallelism.num_pp_microbatches 4"* ]] &&
    pass "torchtitan, ${pair%%:*}: ${pair#*:}, 1 layer per stage, 4 micro-batches" || bad "torchtitan, ${pair%%:*}: $out"
done
refused "torchtitan, ZeRO-1" "torchtitan has no ZeRO-1" "$T/tiny.toml" --for torchtitan
refused "torchtitan, EP with TP" "takes EP ranks from TP first" "$T/mixtral-8x7b.toml" --for torchtitan --set parallel.order=tp-cp-ep-dp-pp
refused "torchtitan, pp-before-dp order" "torchtitan's device mesh is (pp, dp_replicate, dp_shard, cp, tp)" "$T/llama3-405b.toml" --for torchtitan
refused "an unknown framework" "--for deepspeed: unknown framework; use megatron or torchtitan" "$T/tiny.toml" --for deepspeed
refused "--for with --format svg" "--for with --format svg: the drawing has no place for the framework's flags" \
  "$T/tiny.toml" --for megatron --format svg
# --for with --format json: the plan and the framework's flags together (the same words as --for alone).
alone=$("$M" plan "$T/tiny.toml" --for megatron)
json_flags=$("$M" plan "$T/tiny.toml" --for megatron --format json | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["framework"]["flags"]))')
[[ -n $alone && $json_flags == "$alone" ]] && pass "--for with --format json: the plan with the same flags" ||
  bad "--for --format json flags '$json_flags' differ from --for alone '$alone'"

# Context parallelism's cp_comm as Megatron-Core's cp_comm_type: p2p, all_gather, a2a, a2a+p2p with
# --hierarchical-context-parallel-sizes (a2a group first: Megatron's level-1 groups are consecutive CP ranks,
# parallel_state.create_hierarchical_groups, as meshrun's all-to-all groups).
cpflags() { "$M" plan "$T/tiny.toml" --set parallel.tp=1 --set parallel.zero_stage=0 --set training.seq_len=256 "$@" --for megatron; }
for pair in "ring:--cp-comm-type p2p" "allgather:--cp-comm-type all_gather" "alltoall:--cp-comm-type a2a"; do
  mode=${pair%%:*} want=${pair#*:}
  out=$(cpflags --set parallel.cp=2 --set parallel.cp_comm="$mode")
  [[ " $out " == *" $want "* && $out != *hierarchical* ]] && pass "megatron cp2 $mode: $want" || bad "megatron cp2 $mode: '$out'"
done
out=$(cpflags --set parallel.cp=4 --set parallel.cp_comm=alltoall+ring --set parallel.cp_alltoall=2)
[[ " $out " == *" --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2 "* ]] &&
  pass "megatron cp4 alltoall+ring groups of 2: a2a+p2p, hierarchical sizes 2 2" || bad "megatron cp4 alltoall+ring: '$out'"
refused "megatron, alltoall+ring with cp_alltoall not dividing cp" "set cp_alltoall to a divisor of cp from 2 to cp/2" \
  "$T/tiny.toml" --set parallel.tp=1 --set parallel.cp=4 --set training.seq_len=256 --set parallel.cp_comm=alltoall+ring \
  --set parallel.cp_alltoall=3 --for megatron
refused "torchtitan, all-to-all CP" "torchtitan's context parallelism is ring attention" "$T/tiny.toml" --set parallel.zero_stage=0 \
  --set parallel.cp=2 --set training.seq_len=256 --set parallel.cp_comm=alltoall --for torchtitan

# With a template, the model's shape as Megatron's GPT flags (templates/mixtral-8x7b.toml's [model]).
out=$("$M" plan "$T/mixtral-8x7b.toml" --for megatron)
missing=""
for want in "--num-layers 32" "--hidden-size 4096" "--ffn-hidden-size 14336" "--num-attention-heads 32" \
            "--group-query-attention --num-query-groups 8" "--max-position-embeddings 4096" "--position-embedding-type rope" \
            "--rotary-base 1000000" "--normalization RMSNorm" "--norm-epsilon 1e-05" "--disable-bias-linear" "--swiglu" \
            "--untie-embeddings-and-output-weights" "--num-experts 8" "--moe-router-topk 2" "--moe-ffn-hidden-size 14336"; do
  [[ " $out " == *" $want "* ]] || missing+=" [$want]"
done
[[ -z $missing ]] && pass "megatron model flags from the template: $(echo "$out" | grep -o -- '--num-layers.*')" ||
  bad "megatron model flags missing:$missing in '$out'"

# training.recompute: Megatron's --recompute-granularity (full: uniform, 1 layer; selective of expert layers:
# --recompute-modules layernorm moe_act); dense selective has no Megatron or torchtitan equivalent: refused.
out=$("$M" plan "$T/tiny.toml" --set training.recompute=full --for megatron)
[[ " $out " == *" --recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "* ]] &&
  pass "megatron recompute full: --recompute-granularity full --recompute-method uniform --recompute-num-layers 1" ||
  bad "megatron recompute full: '$out'"
out=$("$M" plan "$T/mixtral-8x7b.toml" --for megatron)
[[ " $out " == *" --recompute-granularity selective --recompute-modules layernorm moe_act "* ]] &&
  pass "megatron recompute selective, experts: --recompute-modules layernorm moe_act" || bad "megatron selective experts: '$out'"
out=$("$M" plan "$T/tiny.toml" --for megatron)
[[ $out != *recompute* ]] && pass "megatron recompute none: no recompute flag" || bad "megatron none: '$out'"
refused "megatron, dense selective recomputation" "Megatron-LM recomputes a dense MLP only whole" "$T/llama3-8b.toml" --for megatron
refused "torchtitan, selective recomputation" "torchtitan's selective activation checkpointing is per operator" \
  "$T/tiny.toml" --set parallel.zero_stage=0 --set training.recompute=selective --for torchtitan
for mode in none full; do
  out=$("$M" plan "$T/tiny.toml" --set parallel.zero_stage=0 --set training.recompute=$mode --for torchtitan)
  [[ " $out " == *" --activation_checkpoint.mode $mode "* ]] && pass "torchtitan recompute $mode: --activation_checkpoint.mode $mode" ||
    bad "torchtitan recompute $mode: '$out'"
done

# Without a template: the layout's flags only (the command's own batch flags stay).
out=$("$M" plan --nodes 1 --gpus-per-node 8 --mesh-tp 4 --for megatron)
[[ $out == "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 1 --context-parallel-size 1" ]] &&
  pass "no template: layout flags only ($out)" || bad "no template: '$out'"

# meshrun exec --for: the words appended to the command, a clash refused.
out=$("$M" exec --template "$T/tiny.toml" --rank 1 --world-size 4 --no-bind --for megatron -- /bin/echo train.py --lr 1 2>/dev/null)
[[ $out == "train.py --lr 1 $("$M" plan "$T/tiny.toml" --for megatron)" ]] && pass "exec --for appends the flags: $out" ||
  bad "exec --for: '$out'"
out=$("$M" exec --template "$T/tiny.toml" --rank 0 --world-size 4 --no-bind --for megatron -- /bin/echo train.py --seq-length 64 2>/dev/null)
[[ $out == "train.py --seq-length 64 "* && $out != *"--seq-length 64 "*"--seq-length"* ]] && pass "a flag the command already gives with the same value is not repeated" ||
  bad "same value: '$out'"
"$M" exec --template "$T/tiny.toml" --rank 0 --world-size 4 --no-bind --for megatron -- /bin/echo train.py --tensor-model-parallel-size 4 \
  >"$DIR/out" 2>"$DIR/err"; rc=$?
[[ $rc -eq 2 && ! -s $DIR/out ]] && grep -q "the command already gives --tensor-model-parallel-size 4 but the layout needs --tensor-model-parallel-size 2" "$DIR/err" &&
  pass "a command that sets another tensor-parallel size is refused: $(cat "$DIR/err")" || bad "clash: exit $rc: $(cat "$DIR/err" "$DIR/out")"
# Flags with two values (--recompute-modules layernorm moe_act): compared and kept whole.
X=("$M" exec --template "$T/tiny-moe.toml" --set training.recompute=selective --rank 0 --world-size 4 --no-bind --for megatron --)
out=$("${X[@]}" /bin/echo train.py --recompute-modules layernorm moe_act 2>/dev/null)
[[ $out == "train.py --recompute-modules layernorm moe_act "* && $(grep -o -- "--recompute-modules" <<<"$out" | wc -l) -eq 1 &&
   " $out " == *" --recompute-granularity selective "* ]] &&
  pass "a two-value flag given with the same values is not repeated" || bad "two values, same: '$out'"
"${X[@]}" /bin/echo train.py --recompute-modules layernorm >"$DIR/out" 2>"$DIR/err"; rc=$?
[[ $rc -eq 2 ]] && grep -q "already gives --recompute-modules layernorm but the layout needs --recompute-modules layernorm moe_act" "$DIR/err" &&
  pass "a two-value flag given with other values is refused: $(cat "$DIR/err")" || bad "two values, other: exit $rc: $(cat "$DIR/err" "$DIR/out")"
exit $fail
