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
"${MPI[@]}" -np 1 "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set training.steps=1 --set data.text_cache="$DIR/corpus.bin" >/dev/null 2>&1 ||
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

# rank_pid RANK: the pid of meshrun-train rank RANK under mpirun $pid.
rank_pid() {
  local p
  for p in $(pgrep -P "$pid"); do
    [[ $(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p') == "$1" ]] && { echo "$p"; return; }
  done
}
# 2b. The heartbeat (its own UDP channel, outside MPI): a stopped rank is named by the others, not by itself.
#     MESHRUN_STEP_TIMEOUT_S stays at its default (60 s), so only the heartbeat can end the job early.
hb_case() {  # NAME RANK: stop RANK after 3 steps, expect the job to end naming it
  local name=$1 victim_rank=$2
  MESHRUN_HEARTBEAT_TIMEOUT_S=5 "${MPI[@]}" -x MESHRUN_HEARTBEAT_TIMEOUT_S -np 4 "$TRAIN" "$TEMPLATE" --set training.steps=5000 \
    --set data.path="$DIR/corpus.bin" --metrics "$DIR/$name.jsonl" >"$DIR/$name.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -f $DIR/$name.jsonl && $(grep -c '"record":"step"' "$DIR/$name.jsonl") -ge 3 ]] && break; sleep 0.1; done
  victim=$(rank_pid "$victim_rank")
  kill -STOP "$victim"
  t0=$(date +%s)
  wait "$pid"; rc=$?
  t=$(($(date +%s) - t0))
  kill -KILL "$victim" 2>/dev/null
  [[ $rc -ne 0 && $t -lt 40 ]] && pass "$name: a stopped rank $victim_rank ends the job (exit $rc after ${t} s, heartbeat limit 5 s)" ||
    bad "$name: exit $rc after ${t} s"
}
hb_case hb-rank2 2
line=$(grep "sent no heartbeat" "$DIR/hb-rank2.out")
[[ $line == "meshrun-train: rank 2 on node $host (pp 0 dp 1 tp 0 cp 0) sent no heartbeat for "*"the others: rank 0 waits in "*"; rank 1 "*"; rank 3 "*"; ending the job" ]] &&
  pass "rank 0 names the stopped rank 2, its node and coordinates, and what ranks 0, 1, 3 wait in" ||
  { bad "no line naming rank 2"; grep -v '^step' "$DIR/hb-rank2.out" | tail -4; }
hb_case hb-rank0 0
grep -q "^meshrun-train: rank 0 on node $host (pp 0 dp 0 tp 0 cp 0) sent no heartbeat for [0-9]* s (limit 5 s): .*(rank 0 is the heartbeat monitor); this rank, [123], .*; ending this rank$" \
  "$DIR/hb-rank0.out" && pass "the other ranks name the stopped rank 0 (the monitor)" ||
  { bad "no line naming rank 0"; grep -v '^step' "$DIR/hb-rank0.out" | tail -4; }

# 2c. A straggler: rank 3 stopped about 3/4 of the time by ../common/slow_rank.sh (a real slowdown, not a flag) is named with its
#     node and coordinates, on stdout and in the metrics.
"${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" --set training.steps=60 --set training.straggler_interval=10 \
  --set data.path="$DIR/corpus.bin" --metrics "$DIR/slow.jsonl" >"$DIR/slow.out" 2>&1 &
pid=$!
for _ in $(seq 600); do [[ -f $DIR/slow.jsonl && $(grep -c '"record":"step"' "$DIR/slow.jsonl") -ge 2 ]] && break; sleep 0.1; done
victim=$(rank_pid 3)
[[ -n $victim ]] || bad "rank 3 not found under mpirun $pid"
stops=$("$(dirname "$0")/../common/slow_rank.sh" "$victim")
wait "$pid"; rc=$?
[[ $rc -eq 0 ]] && grep -qE "^meshrun-train: straggler at steps [0-9]+-[0-9]+: rank 3 on node $host \(pp 0 dp 1 tp 1 cp 0\) computes [0-9.]+ ms per step, the median rank [0-9.]+ ms \(\+[0-9]+%, training.straggler_margin = 30%\)" "$DIR/slow.out" &&
  grep -q '"record":"straggler",.*"rank":3,"node":"'"$host"'"' "$DIR/slow.jsonl" &&
  pass "rank 3, slowed by SIGSTOP/SIGCONT, is named as a straggler (log and metrics): $(grep -c ': rank 3 on' "$DIR/slow.out") of 6 windows, $stops stops" ||
  { bad "rank 3 not named as a straggler (exit $rc, $stops stops)"; grep -E "straggler|finished" "$DIR/slow.out" | head -4; }
grep "straggler at" "$DIR/slow.out" | grep -v ": rank 3 on" | sed 's/^/note: also named: /' | head -3

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
