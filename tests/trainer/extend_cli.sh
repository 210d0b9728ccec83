#!/bin/bash
# Extending a finished run (docs/trainer.md, "Extending a run"): with training.lr_decay_steps = 60, a 40-step
# run resumed with training.steps = 60 equals an uninterrupted 60-step run bit for bit (every step's loss,
# grad_norm and lr, and the final weights). Without lr_decay_steps the schedule's horizon is training.steps,
# so the same extension is refused in one line naming the fix; following the fix (lr_decay_steps = 40) the run
# continues, and differs from the 60-step schedule (the control that the horizon matters). training.steps below
# the checkpoint's step is refused.
# usage: extend_cli.sh MESHRUN_TRAIN MESHRUN_TOKENIZE TEMPLATE MPIRUN
set -u
TRAIN=$1 TOKENIZE=$2 TEMPLATE=$3 MPIRUN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-extend-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
# step, loss, grad_norm, lr of every metrics line (the text is the shortest round-trip form: equal text = equal bits)
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),"lr":\([^,]*\),.*/\1 \2 \3 \4/p' "$1"; }

"$TOKENIZE" "$DIR/corpus.bin" /usr/share/common-licenses >/dev/null || { echo "FAIL tokenizer"; exit 1; }
# tiny.toml at a quarter of its width and sequence (the schedule and the checkpoint path are the same; 2 ranks: tp 2).
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set data.path="$DIR/corpus.bin" --set parallel.tp=2 --set model.hidden=64
     --set model.ffn_hidden=160 --set training.seq_len=32 --set training.global_batch_size=8)

# 1. The uninterrupted 60-step run, and 40 steps then extended to 60, both with lr_decay_steps = 60.
expect 0 "" "uninterrupted: 60 steps, lr_decay_steps = 60" -- "${RUN[@]}" --set training.steps=60 \
  --set training.lr_decay_steps=60 --metrics "$DIR/ref.jsonl" --set checkpoint.save="$DIR/ref.safetensors"
expect 0 "" "first segment: 40 steps, lr_decay_steps = 60" -- "${RUN[@]}" --set training.steps=40 \
  --set training.lr_decay_steps=60 --set checkpoint.dir="$DIR/ext" --metrics "$DIR/ext.jsonl"
expect 0 "resuming from $DIR/ext/step-40: step 40" "extended: the same checkpoint.dir with training.steps = 60 resumes at 40" -- \
  "${RUN[@]}" --set training.steps=60 --set training.lr_decay_steps=60 --set checkpoint.dir="$DIR/ext" \
  --metrics "$DIR/ext.jsonl" --set checkpoint.save="$DIR/ext.safetensors"
[[ $(numbers "$DIR/ref.jsonl" | wc -l) -eq 60 ]] && pass "the reference has 60 step records" || bad "reference records: $(numbers "$DIR/ref.jsonl" | wc -l)"
if diff <(numbers "$DIR/ref.jsonl") <(numbers "$DIR/ext.jsonl") >"$DIR/diff"; then
  pass "40 + 20 steps: loss, grad_norm and lr of all 60 steps == the uninterrupted run's, bit for bit"
else bad "the extended run differs from the uninterrupted one:"; head -4 "$DIR/diff"; fi
cmp -s "$DIR/ref.safetensors" "$DIR/ext.safetensors" && pass "final weights byte-identical to the uninterrupted run's" \
  || bad "final weights differ"
[[ $(cat "$DIR/ext/status") == "finished 60" ]] && pass "status file: finished 60" || bad "status: $(cat "$DIR/ext/status")"
python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['training']; assert t['lr_decay_steps']==60 and 'steps' not in t, t" \
  "$DIR/ext/step-60/manifest.json" && pass "the manifest records lr_decay_steps = 60 (and not training.steps)" || bad "manifest training section"

# 2. Without lr_decay_steps the horizon is training.steps (40): extending it would change the schedule of the
#    steps already taken, so it is refused; the line names the fix.
expect 0 "" "40 steps without lr_decay_steps" -- "${RUN[@]}" --set training.steps=40 --set checkpoint.dir="$DIR/plain" \
  --metrics "$DIR/plain.jsonl"
expect 2 "manifest.json: the learning-rate schedule's horizon (training.lr_decay_steps, or training.steps when unset) = 40 in the checkpoint but 60 in this run; set training.lr_decay_steps = 40 to continue its schedule" \
  "extending without lr_decay_steps is refused in one line" -- "${RUN[@]}" --set training.steps=60 --set checkpoint.dir="$DIR/plain"
lines=$(grep -c "meshrun-train:" "$DIR/out")
[[ $lines -eq 1 ]] && pass "the refusal is one line" || bad "the refusal has $lines lines"
expect 0 "resuming from $DIR/plain/step-40: step 40" "with the fix (lr_decay_steps = 40) the run continues at min_lr" -- \
  "${RUN[@]}" --set training.steps=60 --set training.lr_decay_steps=40 --set checkpoint.dir="$DIR/plain" --metrics "$DIR/plain.jsonl"
# Control: the first 40 steps used the 40-step schedule, so they differ from the 60-step run's; after 40 the lr is min_lr.
if diff -q <(numbers "$DIR/ref.jsonl") <(numbers "$DIR/plain.jsonl") >/dev/null; then bad "the 40-step schedule equals the 60-step one"
else pass "control: a run on the 40-step schedule differs from the 60-step run"; fi
python3 - "$DIR/plain.jsonl" "$DIR/ref.jsonl" <<'PY' && pass "lr after step 40 of the 40-step horizon = min_lr (3e-4); the 60-step run's lr at step 41 is above it" || bad "lr past the horizon"
import json, sys
plain = [r for r in map(json.loads, open(sys.argv[1])) if r["record"] == "step"]
ref = [r for r in map(json.loads, open(sys.argv[2])) if r["record"] == "step"]
assert len(plain) == 60, len(plain)
assert all(r["lr"] == 3e-4 for r in plain[40:]), [r["lr"] for r in plain[40:]]
assert ref[40]["lr"] > 3e-4 and ref[59]["lr"] == 3e-4, (ref[40]["lr"], ref[59]["lr"])
PY

# 3. training.steps below the checkpoint's step cannot continue: refused.
expect 2 "the checkpoint is at step 60 but training.steps = 30; set training.steps >= 60 or use another checkpoint.dir" \
  "training.steps below the checkpoint's step is refused" -- "${RUN[@]}" --set training.steps=30 \
  --set training.lr_decay_steps=60 --set checkpoint.dir="$DIR/ext"
exit $fail
