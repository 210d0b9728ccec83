#!/bin/bash
# checkpoint.finetune = DIR (issue 47 item 12; Megatron's --finetune): a new run from the weights of a meshrun
# checkpoint, resharded onto another layout, with fresh AdamW moments, step and data position.
#   - the run equals checkpoint.load of the same checkpoint's exported weights bit for bit (loss, grad_norm, lr
#     of every step), on tp 2 from a dp 2 checkpoint and on dp 2 ZeRO-3 from one step-N; a load of moments or
#     step, or missing weights, would make them differ;
#   - control: the fine-tuned run's first loss differs from a run from initialization;
#   - its own checkpoint.dir wins on a restart (the log names checkpoint.finetune as not used);
#   - refusals, one line and exit 2: with checkpoint.load, a missing directory (also `meshrun plan`), a file,
#     a directory inside checkpoint.dir (nothing of it removed), another model shape, another dtype.
# Real mpirun, real files. usage: finetune.sh MESHRUN_TRAIN MESHRUN_CKPT MESHRUN TEMPLATE MPIRUN
set -u
TRAIN=$1 CKPT=$2 MESHRUN=$3 TEMPLATE=$4 MPIRUN=$5
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-finetune-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set data.text_cache="$DIR/corpus.bin" --set data.text="$DIR/corpus.txt"
     --set training.global_batch_size=8)
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),"lr":\([^,]*\),.*/\1 \2 \3 \4/p' "$1"; }
# same NAME A B: two metrics files with the same steps, bit for bit (shortest round-trip text).
same() {
  numbers "$2" >"$DIR/a" && numbers "$3" >"$DIR/b"
  if [[ $(wc -l <"$DIR/a") -ge 2 ]] && cmp -s "$DIR/a" "$DIR/b"; then pass "$1"
  else bad "$1:"; paste "$DIR/a" "$DIR/b" | head -4; fi
}

# The earlier run: dp 2 (tp 1), 4 steps, checkpoints at 2 and 4; its weights exported.
expect 0 "latest = step-4" "the earlier run: dp 2, 4 steps" -- "${RUN[@]}" --set parallel.tp=1 --set training.steps=4 \
  --set checkpoint.interval=2 --set checkpoint.dir="$DIR/A" --metrics "$DIR/A.jsonl"
expect 0 "" "its step-4 exported" -- "$CKPT" export "$DIR/A" "$DIR/hfA"
expect 0 "" "its step-2 exported" -- "$CKPT" export "$DIR/A/step-2" "$DIR/hfA2"

# 1. tp 2 from the dp 2 checkpoint (its latest) against checkpoint.load of the exported step-4.
ft=(--set parallel.tp=2 --set parallel.dp=1 --set training.steps=3 --set training.lr=0.002)
expect 0 "starting at step 0 from the weights of $DIR/A/step-4 (checkpoint.finetune: saved at step 4 under tp=1" \
  "finetune = a checkpoint.dir: its latest, onto tp 2" -- \
  "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/A" --set checkpoint.dir="$DIR/B" --metrics "$DIR/B.jsonl"
grep -q "finished steps 1\.\.3" "$DIR/out" && pass "the fine-tuned run counts its own steps from 1" ||
  bad "not steps 1..3: $(grep finished "$DIR/out")"
expect 0 "from the weights in $DIR/hfA (checkpoint.load)" "the same weights through checkpoint.load" -- \
  "${RUN[@]}" "${ft[@]}" --set checkpoint.load="$DIR/hfA" --metrics "$DIR/L.jsonl"
same "finetune = checkpoint.load of the exported weights, bit for bit (fresh moments, step, lr schedule)" \
  "$DIR/B.jsonl" "$DIR/L.jsonl"
expect 0 "" "control: the same run from initialization" -- "${RUN[@]}" "${ft[@]}" --metrics "$DIR/I.jsonl"
numbers "$DIR/B.jsonl" | head -1 >"$DIR/a" && numbers "$DIR/I.jsonl" | head -1 >"$DIR/b"
[[ -s $DIR/a ]] && ! cmp -s "$DIR/a" "$DIR/b" && pass "control: the fine-tuned first step differs from initialization's" ||
  bad "control: the first steps are equal: $(cat "$DIR/a")"

# 2. One step-N onto dp 2 ZeRO-3 (every state staged) against checkpoint.load of that step's export.
z3=(--set parallel.tp=1 --set parallel.dp=2 --set parallel.zero_stage=3 --set training.steps=2)
expect 0 "starting at step 0 from the weights of $DIR/A/step-2 (checkpoint.finetune: saved at step 2" \
  "finetune = one step-N, onto dp 2 ZeRO-3" -- \
  "${RUN[@]}" "${z3[@]}" --set checkpoint.finetune="$DIR/A/step-2" --metrics "$DIR/B3.jsonl"
expect 0 "" "the same weights through checkpoint.load, ZeRO-3" -- \
  "${RUN[@]}" "${z3[@]}" --set checkpoint.load="$DIR/hfA2" --metrics "$DIR/L3.jsonl"
same "ZeRO-3: finetune = checkpoint.load of the exported step-2, bit for bit" "$DIR/B3.jsonl" "$DIR/L3.jsonl"

# 3. A restart of the fine-tuned run (extended by a step, its schedule's horizon kept) resumes its own checkpoint.dir.
expect 0 "resuming from $DIR/B/step-3: step 3.*checkpoint.finetune = $DIR/A not used (the checkpoint wins)" \
  "a restart resumes the run's own checkpoint.dir, not the fine-tune source" -- \
  "${RUN[@]}" "${ft[@]/training.steps=3/training.steps=4}" --set training.lr_decay_steps=3 --set checkpoint.finetune="$DIR/A" --set checkpoint.dir="$DIR/B" --no-metrics

# 4. Refusals.
expect 2 "checkpoint.finetune = $DIR/A and checkpoint.load = $DIR/hfA both name the weights to start from; keep one" \
  "finetune with checkpoint.load" -- "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/A" --set checkpoint.load="$DIR/hfA" --no-metrics
one_line "finetune with checkpoint.load"
expect 2 "checkpoint.finetune = $DIR/nope: no such directory" "a missing finetune directory" -- \
  "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/nope" --no-metrics
one_line "a missing finetune directory"
expect 2 "checkpoint.finetune = $DIR/nope: no such directory" "meshrun plan refuses it too" -- \
  "$MESHRUN" plan "$TEMPLATE" --no-site --set checkpoint.finetune="$DIR/nope"
expect 2 "is not a meshrun checkpoint (no latest, no manifest.json).*set checkpoint.load for a safetensors file" \
  "finetune = a safetensors file" -- "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/hfA/model.safetensors" --no-metrics
one_line "finetune = a safetensors file"
before=$(find "$DIR/A" -type f | sort | xargs md5sum)
expect 2 "checkpoint.finetune = $DIR/A/step-2 is inside checkpoint.dir = $DIR/A, which this run writes and prunes" \
  "finetune inside checkpoint.dir" -- "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/A/step-2" --set checkpoint.dir="$DIR/A" --no-metrics
one_line "finetune inside checkpoint.dir"
[[ $(find "$DIR/A" -type f | sort | xargs md5sum) == "$before" ]] && pass "the source checkpoint is untouched" ||
  bad "the refused run changed $DIR/A"
expect 2 "has shape .*, the model expects .*; check the \[model\] sizes" "finetune onto another model shape" -- \
  "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/A" --set model.ffn_hidden=320 --no-metrics
one_line "finetune onto another model shape"
expect 2 "holds F32 values but this run computes in F64; set training.dtype = fp32 (or bf16) to fine-tune it" \
  "finetune into another dtype" -- "${RUN[@]}" "${ft[@]}" --set checkpoint.finetune="$DIR/A" --set training.dtype=fp64 --no-metrics
one_line "finetune into another dtype"
exit $fail
