#!/bin/bash
# Megatron indexed datasets, blends and validation through meshrun-train (real mpirun, real files): a blend of
# two datasets trains on tiny with data.valid, eval_loss is in the progress line and in the metrics of the
# evaluated steps only; a run resumed from a checkpoint continues the blend's sample sequence and the validation
# losses bit for bit, also with the datasets moved (the checkpoint records sizes and normalised weights, not paths);
# a resume with another blend is refused in one line naming data.blend, nothing written; data.path may name an
# indexed dataset; broken data is refused in one line, exit 2.
# usage: data_cli.sh MESHRUN_TRAIN MAKE_INDEXED TEMPLATE MPIRUN
set -u
TRAIN=$1 MAKE=$2 TEMPLATE=$3 MPIRUN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-data-cli-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
lines=$(wc -l <"$DIR/corpus.txt")
q=$((lines / 4))
"$MAKE" "$DIR/web" "$DIR/corpus.txt" 0 $((2 * q)) && "$MAKE" "$DIR/code" "$DIR/corpus.txt" $((2 * q)) "$q" &&
  "$MAKE" "$DIR/valid" "$DIR/corpus.txt" $((3 * q)) "$lines" || { echo "FAIL make_indexed"; exit 1; }
BLEND="data.blend=[[0.7, \"$DIR/web\"], [0.3, \"$DIR/code.bin\"]]"
RUN=("${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" --no-site --set data.text= --set "$BLEND" --set data.valid="$DIR/valid"
     --set training.steps=6 --set training.eval_interval=3 --set training.eval_batches=2)
# step, loss, grad_norm and eval_loss (or -) of every step record (shortest round-trip text: equal text = equal bits)
numbers() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["record"] == "step":
        print(r["step"], repr(r["loss"]), repr(r["grad_norm"]), repr(r.get("eval_loss", "-")))
PY
}

# 1. The blend trains; validation after steps 3 and 6 only, in the progress line and the metrics.
expect 0 "eval_loss" "a blend of two indexed datasets trains with data.valid" -- "${RUN[@]}" --metrics "$DIR/ref.jsonl" \
  --set checkpoint.dir="$DIR/ref" --set checkpoint.interval=3
n=$(grep -c "| eval_loss " "$DIR/out")
[[ $n -eq 2 ]] && pass "the progress line shows eval_loss after steps 3 and 6" || bad "$n progress lines with eval_loss, expected 2"
evaluated=$(numbers "$DIR/ref.jsonl" | awk '$4 != "'"'-'"'" {print $1}' | tr '\n' ' ')
[[ $evaluated == "3 6 " ]] && pass "metrics: eval_loss in the step records of steps 3 and 6 only" ||
  bad "metrics: eval_loss in steps '$evaluated'"

# 2. Resume from step 3: the blend's samples and the validation continue exactly.
rm -rf "$DIR/ref/step-6" && echo step-3 >"$DIR/ref/latest"
expect 0 "resuming from $DIR/ref/step-3" "the blend resumes from step 3" -- "${RUN[@]}" --metrics "$DIR/resumed.jsonl" \
  --set checkpoint.dir="$DIR/ref" --set checkpoint.interval=3
if diff <(numbers "$DIR/ref.jsonl" | sed -n '4,6p') <(numbers "$DIR/resumed.jsonl") >"$DIR/diff"; then
  pass "steps 4-6 after the resume: loss, grad_norm and eval_loss equal the uninterrupted run's bit for bit"
else bad "the resumed steps differ:"; head -4 "$DIR/diff"; fi
# ... and from the datasets moved elsewhere, with the weights scaled (7/3 normalise to 0.7/0.3): the checkpoint
# records each entry's normalised weight and dataset size, not its path.
mkdir "$DIR/moved" && cp "$DIR"/web.* "$DIR"/code.* "$DIR/moved/" && echo step-3 >"$DIR/ref/latest"
expect 0 "resuming from $DIR/ref/step-3" "the blend resumes with its datasets moved and its weights scaled" -- "${RUN[@]}" \
  --metrics "$DIR/moved.jsonl" --set checkpoint.dir="$DIR/ref" --set checkpoint.interval=3 \
  --set "data.blend=[[7, \"$DIR/moved/web\"], [3, \"$DIR/moved/code\"]]"
if diff <(numbers "$DIR/ref.jsonl" | sed -n '4,6p') <(numbers "$DIR/moved.jsonl") >"$DIR/diff"; then
  pass "steps 4-6 after the moved resume equal the uninterrupted run's bit for bit"
else bad "the moved resume's steps differ:"; head -4 "$DIR/diff"; fi
# Another blend is refused at resume, one line naming data.blend and what differs, exit 2, nothing written (the
# checkpoint directory's files other than the lock, which records its holder, and no metrics file).
snapshot() { (cd "$DIR/ref" && find . -path ./lock -prune -o -printf '%p %s %T@\n' | sort; cat latest); }
refuse_resume() {
  local what=$1 pattern=$2 blend=$3 before
  shift 3
  echo step-3 >"$DIR/ref/latest"
  before=$(snapshot)
  expect 2 "meshrun-train: .*data.blend differs from the checkpoint's: $pattern" "resume refused: $what" -- "${RUN[@]}" \
    --metrics "$DIR/refused.jsonl" --set checkpoint.dir="$DIR/ref" --set checkpoint.interval=3 --set "data.blend=$blend" "$@"
  [[ $(grep -c "meshrun-train:" "$DIR/out") -eq 1 ]] || bad "$what: not one line"
  [[ $(snapshot) == "$before" && ! -e "$DIR/refused.jsonl" ]] && pass "$what: nothing written" || bad "$what: files written"
}
refuse_resume "the weights swapped" "entry 0's normalised weight = 0.7 in the checkpoint but 0.3 in this run" \
  "[[0.3, \"$DIR/web\"], [0.7, \"$DIR/code.bin\"]]"
refuse_resume "entry 1 another dataset" "entry 1's dataset = [0-9]* tokens, [0-9]* documents in the checkpoint but" \
  "[[0.7, \"$DIR/web\"], [0.3, \"$DIR/valid\"]]"
refuse_resume "a third entry" "2 entries in the checkpoint but 3 entries in this run" \
  "[[0.7, \"$DIR/web\"], [0.3, \"$DIR/code\"], [0.1, \"$DIR/valid\"]]"
refuse_resume "one dataset instead of the blend" "2 entries in the checkpoint but one dataset (data.path) in this run" "[]" \
  --set data.path="$DIR/web"

# ... and another blend is another sequence (the comparison above can fail).
expect 0 "" "the same run with the weights swapped" -- "${RUN[@]}" --metrics "$DIR/swapped.jsonl" \
  --set "data.blend=[[0.3, \"$DIR/web\"], [0.7, \"$DIR/code.bin\"]]"
if ! diff -q <(numbers "$DIR/ref.jsonl") <(numbers "$DIR/swapped.jsonl") >/dev/null; then
  pass "weights 0.3/0.7 give other losses than 0.7/0.3"
else bad "swapping the weights changed nothing"; fi

# 3. data.path naming an indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx) trains without a blend.
for p in "$DIR/web" "$DIR/web.idx"; do
  expect 0 "step     2/2" "data.path = $(basename "$p"): an indexed dataset" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" --no-site \
    --set data.text= --set data.path="$p" --set training.steps=2 --no-metrics
done

# 4. Refusals: one line naming the file or key, exit 2, on rank 0's stderr.
refuse() {
  local what=$1 pattern=$2; shift 2
  expect 2 "$pattern" "$what" -- "${RUN[@]}" --no-metrics "$@"
  [[ $(grep -c "meshrun-train:" "$DIR/out") -eq 1 ]] || bad "$what: not one line"
}
refuse "a blend entry that does not exist" "data.blend entry 1: token file .*code-missing" --set "data.blend=[[1, \"$DIR/web\"], [1, \"$DIR/code-missing\"]]"
refuse "ids >= model.vocab" ">= model.vocab (100)" --set model.vocab=100
cp "$DIR/code.idx" "$DIR/cut.idx" && head -c 1000 "$DIR/code.bin" >"$DIR/cut.bin"
refuse "a truncated .bin" "cut" --set "data.blend=[[1, \"$DIR/web\"], [1, \"$DIR/cut\"]]"
refuse "a missing data.valid" "valid-missing" --set data.valid="$DIR/valid-missing.bin"
refuse "weights that sum to 0" "data.blend's weights sum to 0" --set "data.blend=[[0, \"$DIR/web\"], [0, \"$DIR/code\"]]"
refuse "eval_interval without data.valid" "needs validation data" --set data.valid=
exit $fail
