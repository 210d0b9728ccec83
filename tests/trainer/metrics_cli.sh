#!/bin/bash
# Where meshrun-train's metrics go and what a resumed run does to them (trainer/src/run/metrics.cpp):
# without --metrics they go to checkpoint.dir/metrics.jsonl (or job.output_dir/metrics.jsonl); a run resumed
# from step-2 keeps the records before it and appends its own run record and steps; --no-metrics writes
# none; a directory that cannot be written is one line, exit 2. Real mpirun, real files.
# usage: metrics_cli.sh MESHRUN_TRAIN TEMPLATE MPIRUN
set -u
TRAIN=$1 TEMPLATE=$2 MPIRUN=$3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-metrics-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set data.text_cache="$DIR/corpus.bin" --set data.text="$DIR/corpus.txt"
     --set parallel.tp=2 --set parallel.dp=1 --set training.global_batch_size=8 --set training.steps=4)

# records FILE: one word per line, "run:START" or "step:N", in file order.
records() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"run:{r['start_step']}" if r["record"] == "run" else f"{r['record']}:{r.get('step')}")
PY
}

# 1. checkpoint.dir: the default place; the resumed run appends after the steps it keeps.
expect 0 "metrics: $DIR/ck/metrics.jsonl (checkpoint.dir)" "the banner names checkpoint.dir/metrics.jsonl" -- \
  "${RUN[@]}" --set checkpoint.dir="$DIR/ck" --set checkpoint.interval=2
cp "$DIR/ck/metrics.jsonl" "$DIR/first.jsonl"
[[ $(records "$DIR/first.jsonl" | tr '\n' ' ') == "run:0 step:1 step:2 step:3 step:4 " ]] &&
  pass "a fresh run: its run record, then steps 1-4" || bad "fresh run's records: $(records "$DIR/first.jsonl" | tr '\n' ' ')"
rm -rf "$DIR/ck/step-4" && echo step-2 >"$DIR/ck/latest"
expect 0 "resuming from $DIR/ck/step-2" "resumed from step-2 with the default metrics" -- \
  "${RUN[@]}" --set checkpoint.dir="$DIR/ck" --set checkpoint.interval=2
got=$(records "$DIR/ck/metrics.jsonl" | tr '\n' ' ')
[[ $got == "run:0 step:1 step:2 run:2 step:3 step:4 " ]] &&
  pass "resumed: steps 1-2 kept, the new run record and steps 3-4 appended" || bad "resumed run's records: $got"
# The kept and the rewritten steps carry the same numbers as the first run's (a resume is bit-exact).
steps() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }
if [[ $(steps "$DIR/first.jsonl" | wc -l) -eq 4 ]] && cmp -s <(steps "$DIR/first.jsonl") <(steps "$DIR/ck/metrics.jsonl"); then
  pass "the resumed file's four steps equal the first run's bit for bit"
else bad "the resumed file's steps differ"; paste <(steps "$DIR/first.jsonl") <(steps "$DIR/ck/metrics.jsonl"); fi

# 2. job.output_dir wins over checkpoint.dir, and is created.
expect 0 "metrics: $DIR/runs/run1/metrics.jsonl (job.output_dir)" "job.output_dir: metrics there" -- \
  "${RUN[@]}" --set job.output_dir="$DIR/runs/run1" --set checkpoint.dir="$DIR/ck2"
[[ -s $DIR/runs/run1/metrics.jsonl && ! -e $DIR/ck2/metrics.jsonl ]] &&
  pass "job.output_dir/metrics.jsonl written, checkpoint.dir's not" || bad "job.output_dir's metrics missing or written twice"

# 3. --no-metrics: none; with neither directory: none, and the banner says why.
expect 0 "metrics: not written (--no-metrics)" "--no-metrics" -- "${RUN[@]}" --set checkpoint.dir="$DIR/ck3" --no-metrics
[[ ! -e $DIR/ck3/metrics.jsonl ]] && pass "--no-metrics wrote no file" || bad "--no-metrics wrote $DIR/ck3/metrics.jsonl"
expect 0 "metrics: not written (no --metrics, job.output_dir or checkpoint.dir)" "no run directory: the banner says so" -- "${RUN[@]}"

# 4. A directory that cannot be written: one line naming the file, exit 2, nothing trained.
expect 2 "cannot write metrics file /proc/meshrun-no/metrics.jsonl" "an unwritable job.output_dir is refused" -- \
  "${RUN[@]}" --set job.output_dir=/proc/meshrun-no
grep -q "^step " "$DIR/out" && bad "steps ran despite the refused metrics file" || pass "no step ran"
# 5. A write that fails (a full disk: /dev/full) is said once; training goes on and ends normally.
expect 0 "warning: cannot write the metrics file /dev/full (No space left on device); records from here on may be missing, training continues" \
  "a full disk: one warning, training continues" -- "${RUN[@]}" --metrics /dev/full
[[ $(grep -c "cannot write the metrics file" "$DIR/out") -eq 1 ]] && grep -q "^step     4/4" "$DIR/out" &&
  pass "said once, all 4 steps ran" || bad "the warning is not said exactly once or the run stopped"
exit $fail
