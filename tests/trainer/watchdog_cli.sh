#!/bin/bash
# Fast, named failure (issue 16 item 7) with real mpirun: a rank that exits before MPI_Init no longer leaves the
# others waiting in MPI_Init (they end after MESHRUN_INIT_TIMEOUT_S with a line naming rank and host); a rank
# that stops answering (SIGSTOP) ends the job after MESHRUN_STEP_TIMEOUT_S with such a line; a rank killed
# with SIGKILL ends the job within 60 s and the launcher's line names it (mpirun: "process rank R ... exited on signal 9").
# usage: watchdog_cli.sh MESHRUN_TRAIN TEMPLATE MPIRUN
set -u
TRAIN=$1 TEMPLATE=$2 MPIRUN=$3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-watchdog-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail=0
pass() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
host=$(hostname)
"${MPI[@]}" -np 1 "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set training.steps=1 --set data.path="$DIR/corpus.bin" >/dev/null 2>&1 ||
  { echo "FAIL could not build the corpus"; exit 1; }

# 1. Rank 1 exits before MPI_Init.
t0=$(date +%s)
MESHRUN_INIT_TIMEOUT_S=3 timeout 60 "${MPI[@]}" -x MESHRUN_INIT_TIMEOUT_S -np 2 sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exit 0; fi; exec "$0" "$@"' "$TRAIN" "$TEMPLATE" --set parallel.tp=1 \
  --set data.path="$DIR/corpus.bin" >"$DIR/init.out" 2>&1; rc=$?
t=$(($(date +%s) - t0))
[[ $rc -ne 0 && $rc -ne 124 && $t -lt 30 ]] && pass "a rank missing from MPI_Init ends the job (exit $rc after ${t} s)" ||
  bad "missing rank: exit $rc after ${t} s"
grep -q "meshrun-train: rank 0 on $host: MPI_Init did not complete within 3 s" "$DIR/init.out" &&
  pass "the waiting rank names itself and its host" || { bad "no MPI_Init line"; head -3 "$DIR/init.out"; }

# 2. One rank stops answering (SIGSTOP) in the middle of training.
run_bg() {  # OUT: tiny on 4 ranks, long enough to be interrupted
  MESHRUN_STEP_TIMEOUT_S=8 "${MPI[@]}" -x MESHRUN_STEP_TIMEOUT_S -np 4 "$TRAIN" "$TEMPLATE" --set training.steps=500 \
    --set data.path="$DIR/corpus.bin" --metrics "$DIR/$1.jsonl" >"$DIR/$1.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -f $DIR/$1.jsonl && $(grep -c '"record":"step"' "$DIR/$1.jsonl") -ge 3 ]] && break; sleep 0.1; done
  victim=$(pgrep -P "$pid" | sed -n 2p)
}
run_bg stop
kill -STOP "$victim"
t0=$(date +%s)
wait "$pid"; rc=$?
t=$(($(date +%s) - t0))
kill -KILL "$victim" 2>/dev/null
[[ $rc -ne 0 && $t -lt 60 ]] && pass "a stopped rank ends the job (exit $rc after ${t} s)" || bad "stopped rank: exit $rc after ${t} s"
grep -q "meshrun-train: rank [0-3] on $host: no progress for [0-9]* s (limit [0-9]* s): a peer rank died or stopped answering" \
  "$DIR/stop.out" && pass "the waiting ranks say why, with rank and host" || { bad "no watchdog line"; tail -3 "$DIR/stop.out"; }

# 3. kill -9 of one rank: the job ends and the launcher names the rank.
run_bg kill
rank=$(tr '\0' '\n' <"/proc/$victim/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
kill -KILL "$victim"
t0=$(date +%s)
wait "$pid"; rc=$?
t=$(($(date +%s) - t0))
[[ $rc -ne 0 && $t -lt 60 ]] && pass "kill -9 of rank $rank ends the job (exit $rc after ${t} s)" || bad "kill -9: exit $rc after ${t} s"
grep -q "process rank $rank with PID [0-9]* on node .* exited on signal 9" "$DIR/kill.out" &&
  pass "a line names the killed rank $rank" || { bad "no line naming rank $rank"; tail -5 "$DIR/kill.out"; }
exit $fail
