#!/bin/bash
# Ctrl-C during `meshrun run` of meshrun-train with checkpoint.dir outside Slurm (issue 47 item 11). The terminal's
# SIGINT goes to the foreground process group; the test starts meshrun run in a session of its own (setsid) and
# sends SIGINT to that whole group, as the terminal would:
#   - the ranks save after the current step and stop (checkpoint.signal relayed through mpirun), meshrun run exits
#     75 with DIR/status "saved N USR1", and neither of mpirun's abort banners is printed;
#   - the same command resumes at N and finishes;
#   - SIGTERM twice to meshrun run, the second inside the step (the second aborts): the job ends, exit status
#     neither 0 nor 75.
# Real mpirun, real files. usage: run_interrupt.sh MESHRUN TEMPLATE
set -u
MESHRUN=$1 TEMPLATE=$2
DIR=$(mktemp -d /tmp/meshrun-interrupt-XXXXXX)
trap 'kill -9 -- -$pgid 2>/dev/null; rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
pgid=0
RUN=("$MESHRUN" run "$TEMPLATE" --no-site --set training.steps=2000 --set training.lr_decay_steps=2000)

# start NAME SETTINGS...: meshrun run in its own session, output in $DIR/NAME.out; waits for its step 2.
start() {
  local name=$1; shift
  setsid "${RUN[@]}" "$@" >"$DIR/$name.out" 2>&1 &
  pid=$! pgid=$!
  for _ in $(seq 240); do grep -q "^step  *2/" "$DIR/$name.out" && return 0; sleep 0.5; done
  bad "$name: no step 2 within 120 s"; sed 's/^/     | /' "$DIR/$name.out" | tail -5; return 1
}
# finish: waits (at most 120 s) for meshrun run to end; sets rc.
finish() {
  for _ in $(seq 240); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && { bad "still running 120 s after the signal"; kill -9 -- -"$pgid"; }
  wait "$pid"; rc=$?
}

if start int --set checkpoint.dir="$DIR/ck"; then
  kill -INT -- -"$pgid"
  finish
  out=$DIR/int.out
  [[ $rc -eq 75 ]] && pass "Ctrl-C: meshrun run exits 75" || { bad "Ctrl-C: exit $rc, expected 75"; tail -5 "$out"; }
  status=$(cat "$DIR/ck/status" 2>/dev/null)
  [[ $status =~ ^saved\ ([0-9]+)\ USR1$ ]] && pass "Ctrl-C: DIR/status says '$status'" || bad "Ctrl-C: DIR/status is '$status'"
  n=${BASH_REMATCH[1]:-0}
  grep -q "meshrun run: $DIR/ck/status says \"saved $n USR1\": exit 75" "$out" && pass "Ctrl-C: meshrun run says why it exits 75" ||
    bad "Ctrl-C: no closing line: $(tail -2 "$out")"
  grep -q "Per user-direction\|mpirun detected that one or more processes exited" "$out" &&
    bad "Ctrl-C: mpirun's abort banner was printed" || pass "Ctrl-C: no mpirun abort banner"
  expect 0 "resuming from $DIR/ck/step-$n: step $n" "Ctrl-C: the same command resumes at step $n" -- \
    "${RUN[@]/training.steps=2000/training.steps=$((n + 2))}" --set checkpoint.dir="$DIR/ck"
  [[ $(cat "$DIR/ck/status") == "finished $((n + 2))" ]] && pass "the resumed run finished step $((n + 2))" ||
    bad "status after the resume: $(cat "$DIR/ck/status")"
fi

# Steps of about a second here (64 sequences per rank), so that the second signal comes before the save.
if start term --set checkpoint.dir="$DIR/ck2" --set training.global_batch_size=256; then
  kill -TERM "$pid"; sleep 0.2; kill -TERM "$pid"
  finish
  [[ $rc -ne 0 && $rc -ne 75 ]] && pass "SIGTERM twice: the job is aborted (exit $rc)" || bad "SIGTERM twice: exit $rc"
  grep -q "meshrun run: SIGTERM again: aborting the job" "$DIR/term.out" && pass "SIGTERM twice: says it aborts" ||
    bad "SIGTERM twice: no abort line: $(grep 'meshrun run' "$DIR/term.out")"
fi
exit $fail
