#!/bin/bash
# meshrun-train --trace and meshrun plot --timeline (docs/trainer.md, "Timelines"), through the executables.
# tiny at pp 2 (tp 1, dp 2: 4 ranks) traced for 2 steps with five schedules (1f1b's fused BW, zb's B and W
# apart, interleaved's two chunks per rank, zbv's and dualpipev's V: rank 0 holds the first and the last chunk): every rank's file and the merge exist; the merge passes
# trace_check.py (the trace-event format's keys and types, each rank's F/B/W counts = the schedule of
# `meshrun plan --schedule` for the same layout, sends and receives paired); broken copies of it fail the
# checker; `meshrun plot --timeline` draws an SVG that parses and prints the measured and the simulated bubble,
# the latter equal to meshrun plan's; bad inputs of both commands: one line, exit 2. Nothing here is timed.
# usage: trace_cli.sh MESHRUN_TRAIN MESHRUN TEMPLATE MPIRUN
set -u
TRAIN=$1 MESHRUN=$2 TEMPLATE=$3 MPIRUN=$4
HERE=$(cd "$(dirname "$0")" && pwd)
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-trace-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$HERE/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
LAYOUT=(--no-site --set parallel.tp=1 --set parallel.pp=2 --set training.steps=3)
RUN=("${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" --set data.text_cache="$DIR/corpus.bin" --set data.text="$DIR/corpus.txt" "${LAYOUT[@]}")
CHECK=(python3 "$HERE/trace_check.py")

# expect_one_line CODE PATTERN WHAT -- command: exit CODE and exactly one line on stderr holding PATTERN.
expect_one_line() {
  local code=$1 pattern=$2 what=$3; shift 4
  "$@" >"$DIR/out" 2>"$DIR/err"; local rc=$?
  if [[ $rc -ne $code ]]; then bad "$what: exit $rc, expected $code"; sed 's/^/     | /' "$DIR/err" | tail -5; return; fi
  if [[ $(wc -l <"$DIR/err") -ne 1 ]]; then bad "$what: stderr is not one line"; sed 's/^/     | /' "$DIR/err" | tail -5; return; fi
  grep -qF -- "$pattern" "$DIR/err" && pass "$what" || { bad "$what: stderr lacks '$pattern'"; cat "$DIR/err"; }
}

for sched in 1f1b zb interleaved zbv dualpipev; do
  extra=(--set parallel.pipeline_schedule=$sched)
  [[ $sched == zb || $sched == zbv || $sched == dualpipev ]] && extra+=(--set training.micro_batch_size=2)  # 4 micro-batches
  [[ $sched == interleaved ]] && extra+=(--set parallel.virtual_stages=2)   # 4 chunks of 1 layer
  T=$DIR/$sched
  expect 0 "trace: $T/trace.json: steps 1-2, 4 ranks" "$sched: traced steps 1-2 on 4 ranks" -- \
    "${RUN[@]}" "${extra[@]}" --trace "$T"
  grep -q "^step     3/3" "$DIR/out" && pass "$sched: training went on after the traced steps" || bad "$sched: no step 3"
  for r in 0 1 2 3; do [[ -s $T/trace-rank$r.json ]] || bad "$sched: no $T/trace-rank$r.json"; done
  "$MESHRUN" plan "$TEMPLATE" --schedule --format json "${LAYOUT[@]}" "${extra[@]}" >"$T/plan.json" ||
    bad "$sched: meshrun plan --schedule failed"
  "${CHECK[@]}" "$T/trace.json" "$T/plan.json" 2 >"$DIR/check" 2>&1 &&
    pass "$sched: the merged trace passes the checker" || { bad "$sched: checker"; cat "$DIR/check"; }
  # Each rank's own file is a valid trace of that rank alone (format only: the pairing needs both sides).
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert {e["pid"] for e in d["traceEvents"]} == {2}' \
    "$T/trace-rank2.json" && pass "$sched: trace-rank2.json holds rank 2's events" || bad "$sched: trace-rank2.json"

  # The picture and the two bubble fractions; the simulated one is meshrun plan --schedule's.
  "$MESHRUN" plot --timeline "$T/trace.json" -o "$T/timeline.svg" >"$DIR/out" 2>"$DIR/err"
  rc=$?
  if [[ $rc -eq 0 && ! -s $DIR/err ]]; then pass "$sched: meshrun plot --timeline"; else bad "$sched: plot --timeline exit $rc"; cat "$DIR/err"; fi
  xmllint --noout "$T/timeline.svg" 2>"$DIR/err" && pass "$sched: the SVG parses (xmllint)" || { bad "$sched: xmllint"; cat "$DIR/err"; }
  sim=$(python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["schedule"]["bubble_fraction"])' "$T/plan.json")
  grep -q "^  measured bubble_fraction 0\.[0-9]\{4\} " "$DIR/out" && pass "$sched: measured bubble printed" ||
    { bad "$sched: no measured bubble"; cat "$DIR/out"; }
  grep -q "^  simulated bubble_fraction $sim " "$DIR/out" && pass "$sched: simulated bubble $sim = meshrun plan --schedule's" ||
    { bad "$sched: simulated bubble is not plan's $sim"; cat "$DIR/out"; }
  grep -q "step 2 of" "$DIR/out" && pass "$sched: the last traced step by default" || bad "$sched: not step 2"
done
cat "$DIR/out"

# The checker fails on broken copies of a good trace (so it can fail).
T=$DIR/1f1b
break_copy() {  # NAME PYTHON-EXPRESSION-ON-d: writes $DIR/broken-NAME.json
  python3 - "$T/trace.json" "$DIR/broken-$1.json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
X = [e for e in ev if e["ph"] == "X"]
exec(sys.argv[3])
json.dump(d, open(sys.argv[2], "w"))
PY
}
break_copy ts-string 'X[0]["ts"] = str(X[0]["ts"])'
break_copy dur-negative 'X[1]["dur"] = -1.0'
break_copy no-pid 'del X[2]["pid"]'
break_copy bad-ph 'X[3]["ph"] = "Q"'
break_copy f-removed 'ev.remove([e for e in X if e["name"] == "F" and e["pid"] == 2][-1])'  # rank 2's last: step 2, drawn
break_copy peer-swapped 'next(e for e in X if e["name"] == "send_act")["args"]["peer"] = 3'
break_copy rank-renamed 'next(e for e in ev if e["name"] == "process_name" and e["pid"] == 1)["args"]["name"] = "rank 1 (pp 1, dp 0, tp 0, cp 0) node x"'
for b in ts-string dur-negative no-pid bad-ph f-removed peer-swapped rank-renamed; do
  if "${CHECK[@]}" "$DIR/broken-$b.json" "$T/plan.json" 2 >"$DIR/check" 2>&1; then
    bad "the checker passed a broken trace ($b)"
  else
    pass "the checker rejects the broken trace ($b): $(head -1 "$DIR/check")"
  fi
done

# plot --timeline: a directory stands for its trace.json; --step; PNG where rsvg-convert is installed.
"$MESHRUN" plot --timeline "$T" --step 1 -o "$DIR/s1.svg" >"$DIR/out" 2>&1 && grep -q "step 1 of" "$DIR/out" &&
  pass "plot --timeline DIR --step 1" || { bad "plot --timeline DIR --step 1"; cat "$DIR/out"; }
if command -v rsvg-convert >/dev/null; then
  "$MESHRUN" plot --timeline "$T/trace.json" -o "$DIR/t.png" >/dev/null 2>&1 &&
    [[ $(head -c 8 "$DIR/t.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] && pass "plot --timeline -o PNG" ||
    bad "plot --timeline -o PNG"
fi

# Bad input, plot: one line, exit 2, nothing written.
expect_one_line 2 "$DIR/missing" "plot --timeline: a missing directory" -- "$MESHRUN" plot --timeline "$DIR/missing" -o "$DIR/x.svg"
printf '{"record":"step","step":1,"loss":5}\n' >"$DIR/metrics.jsonl"
expect_one_line 2 "not a trace-event file" "plot --timeline: a metrics file is not a trace" -- "$MESHRUN" plot --timeline "$DIR/metrics.jsonl" -o "$DIR/x.svg"
printf '{"record":"step","step":1}\n{"record":"step","step":2}\n' >"$DIR/two-lines.jsonl"
expect_one_line 2 "not JSON" "plot --timeline: JSON Lines are not a trace" -- "$MESHRUN" plot --timeline "$DIR/two-lines.jsonl" -o "$DIR/x.svg"
printf '{"traceEvents":[{"name":"a","ph":"X","pid":0,"tid":1,"ts":0,"dur":1}]}\n' >"$DIR/foreign.json"
expect_one_line 2 "without otherData.meshrun_trace" "plot --timeline: another program's trace" -- "$MESHRUN" plot --timeline "$DIR/foreign.json" -o "$DIR/x.svg"
expect_one_line 2 "not a trace-event file" "plot --timeline: JSON without traceEvents" -- "$MESHRUN" plot --timeline "$T/plan.json" -o "$DIR/x.svg"
expect_one_line 2 "traceEvents[" "plot --timeline: an event with a string ts" -- "$MESHRUN" plot --timeline "$DIR/broken-ts-string.json" -o "$DIR/x.svg"
expect_one_line 2 "where the 1f1b table has" "plot --timeline: a trace missing an F" -- "$MESHRUN" plot --timeline "$DIR/broken-f-removed.json" -o "$DIR/x.svg"
expect_one_line 2 "step 9 was not traced; the trace holds steps 1, 2" "plot --timeline --step 9" -- "$MESHRUN" plot --timeline "$T" --step 9 -o "$DIR/x.svg"
expect_one_line 2 "--timeline draws one trace" "plot --timeline with a metrics file too" -- "$MESHRUN" plot --timeline "$T" "$DIR/metrics.jsonl" -o "$DIR/x.svg"
[[ ! -e $DIR/x.svg ]] && pass "no output written for bad input" || bad "an output was written for bad input"

# Bad input, meshrun-train: one line from rank 0, exit 2, no step.
expect 2 "--trace needs a value" "meshrun-train --trace without DIR" -- "${RUN[@]}" --trace
expect 2 "--trace-steps 0: give a whole number of steps from 1 to 50" "--trace-steps 0" -- "${RUN[@]}" --trace "$DIR/t0" --trace-steps 0
expect 2 "--trace-steps needs --trace DIR" "--trace-steps without --trace" -- "${RUN[@]}" --trace-steps 3
expect 2 "--trace /proc/meshrun-no: cannot create or write the directory" "an unwritable --trace DIR" -- "${RUN[@]}" --trace /proc/meshrun-no
grep -q "^step " "$DIR/out" && bad "steps ran despite the refused trace directory" || pass "no step ran"
exit $fail
