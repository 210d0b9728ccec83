#!/bin/bash
# Crash safety of the checkpoint commit: a 4-rank run (tiny, tp 2 × dp 2, ZeRO-1, 4 steps, saves at 2 and 4,
# keep = 1) is killed with SIGKILL inside the save of step 4 at N points drawn from a fixed seed (rank, crash
# point of the commit protocol, which occurrence: MESHRUN_CKPT_KILL, docs/trainer.md). Each time the rerun
# must resume from the last committed checkpoint (step 4 once rank 0 renamed `latest`, else step 2)
# and end with weights identical to an uncrashed run's. Prints the number of corrupt resumes.
# With ASYNC=1 (7th argument) every save is checkpoint.async: the shard is written by the background thread.
# usage: checkpoint_crash.sh MESHRUN_TRAIN MESHRUN_TOKENIZE TEMPLATE MPIRUN [N=10] [SEED=16] [ASYNC=0]
set -u
TRAIN=$1 TOKENIZE=$2 TEMPLATE=$3 MPIRUN=$4 N=${5:-10} SEED=${6:-16} ASYNC=${7:-0}
EXTRA=()
[[ $ASYNC == 1 ]] && EXTRA=(--set checkpoint.async=true)
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-ckpt-crash-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail=0 corrupt=0
pass() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

"$TOKENIZE" "$DIR/corpus.bin" /usr/share/common-licenses >/dev/null || { echo "FAIL tokenizer"; exit 1; }
run() {  # run CKPT_DIR OUT [MESHRUN_CKPT_KILL]
  local env=()
  [[ -n ${3:-} ]] && env=(-x MESHRUN_CKPT_KILL="$3")
  "${MPI[@]}" "${env[@]}" -np 4 "$TRAIN" "$TEMPLATE" --set data.path="$DIR/corpus.bin" --set training.steps=4 \
    --set checkpoint.interval=2 --set checkpoint.keep=1 --set checkpoint.dir="$1" \
    --set checkpoint.save="$1.safetensors" "${EXTRA[@]}" >"$2" 2>&1
}
run "$DIR/ref" "$DIR/ref.out" || { bad "reference run failed"; tail -5 "$DIR/ref.out"; exit 1; }

# The draws: rank-local points on any rank, the commit points on rank 0.
mapfile -t draws < <(python3 - "$N" "$SEED" <<'EOF'
import random, sys
n, seed = int(sys.argv[1]), int(sys.argv[2])
r = random.Random(seed)
points = ["shard", "shard-fsync", "gathered", "manifest", "manifest-fsync", "renamed", "latest-tmp", "latest", "pruned"]
order = points[:]
r.shuffle(order)  # the first 9 draws visit every point once, in a seeded order; then any point
for i in range(n):
    p = order[i] if i < len(order) else r.choice(points)
    rank = r.randrange(4) if p in ("shard", "shard-fsync", "gathered") else 0
    k = r.randint(1, 18) if p == "shard" else 1
    print(f"4:{rank}:{p}:{k}")
EOF
)
for i in "${!draws[@]}"; do
  d=${draws[$i]}
  IFS=: read -r _ rank point k <<<"$d"
  ck=$DIR/t$i
  run "$ck" "$DIR/kill.out" "$d"; rc=$?
  if [[ $rc -eq 0 ]] || ! grep -q "rank $rank raises SIGKILL in the save of step 4 at $point #$k" "$DIR/kill.out"; then
    bad "kill $d did not happen (exit $rc)"; tail -3 "$DIR/kill.out"; continue
  fi
  # The commit point is rank 0's rename of latest: before it the previous checkpoint is the committed one, after
  # it the new one. A rank other than 0 killed after the gather may lose the race with rank 0's commit: either
  # outcome is a complete checkpoint, and `latest` says which.
  want=$(sed -n 's/^step-//p' "$ck/latest" 2>/dev/null)
  expect=2
  [[ $point == latest || $point == pruned ]] && expect=4
  [[ $point == gathered && $rank != 0 ]] && expect=$want
  if [[ $want != "$expect" ]]; then
    corrupt=$((corrupt + 1)); bad "kill at $d: latest names step-$want, expected step-$expect"; continue
  fi
  if ! run "$ck" "$DIR/resume.out"; then
    corrupt=$((corrupt + 1)); bad "kill at $d: the rerun failed"; tail -3 "$DIR/resume.out"; continue
  fi
  if ! grep -q "resuming from $ck/step-$want: step $want" "$DIR/resume.out"; then
    corrupt=$((corrupt + 1)); bad "kill at $d: expected a resume from step-$want"; grep "resuming\|starting" "$DIR/resume.out"; continue
  fi
  if ! cmp -s "$DIR/ref.safetensors" "$ck.safetensors"; then
    corrupt=$((corrupt + 1)); bad "kill at $d: final weights differ from the uncrashed run's"; continue
  fi
  pass "SIGKILL at $d (rank $rank, $point #$k): resumed from step-$want, final weights identical"
  rm -rf "$ck" "$ck.safetensors"
done
echo "checkpoint_crash: ${#draws[@]} kills, $corrupt corrupt resumes"
exit $fail
