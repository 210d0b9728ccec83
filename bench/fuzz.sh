#!/bin/bash
# The long fuzz run (docs/robustness.md): every libFuzzer target for SECONDS each (default 600 = 10 minutes),
# one after another under nice -n 19, then a table of executions per target for the doc's table.
# usage: bench/fuzz.sh [SECONDS] [TARGET...]     (from the repository root; builds build-fuzz/ first)
# Exit status 1 when a target found something (its input is under build-fuzz/findings/).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || { echo "bench/fuzz.sh: SECONDS must be a positive number, e.g. 600" >&2; exit 2; }
shift $(( $# > 0 ? 1 : 0 ))
mkdir -p build-fuzz/logs
scripts/fuzz --time "$secs" "$@" | tee build-fuzz/logs/bench-fuzz.txt
rc=${PIPESTATUS[0]}
echo
echo "| target | seconds | executions | exec/s | corpus files |"
echo "|---|---|---|---|---|"
for log in build-fuzz/logs/fuzz_*.log; do
  t=$(basename "$log" .log)
  [ $# -eq 0 ] || [[ " $* " == *" $t "* ]] || continue
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  files=$(find "build-fuzz/corpus/${t#fuzz_}" -type f | wc -l)
  echo "| $t | $secs | ${runs:-?} | ${rate:-?} | $files |"
done
exit "$rc"
