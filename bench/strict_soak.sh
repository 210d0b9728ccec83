#!/bin/bash
# trainer.strict.equivalence N times in a row (default 10), each with 2 CPU-burning processes beside it
# (bench/with_load.sh): the condition under which the strict backend's single-copy race used to hang. Counts
# passes and the failed single-copy reads Open MPI printed ("Read -1, expected N, errno = 14"); logs in OUT.
#   bench/strict_soak.sh [BUILD_DIR] [N] [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
n=${2:-10}
out=${3:-$build/strict-soak}
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "bench/strict_soak.sh: N must be a positive number, e.g. 10" >&2; exit 2; }
[ -x "$build/tests/trainer/trainer_equivalence" ] || { echo "bench/strict_soak.sh: $build has no trainer_equivalence; run scripts/build" >&2; exit 2; }
mkdir -p "$out"
passed=0
reads=0
for i in $(seq "$n"); do
  start=$(date +%s)
  bench/with_load.sh 2 bash -c "cd '$build' && ctest -R '^trainer.strict.equivalence\$' --output-on-failure" \
    > "$out/run-$i.log" 2>&1
  rc=$?
  r=$(grep -c 'Read -1, expected' "$out/run-$i.log")
  reads=$((reads + r))
  [ $rc = 0 ] && passed=$((passed + 1))
  echo "run $i: exit $rc, $(( $(date +%s) - start )) s, $r failed single-copy reads"
done
echo "bench/strict_soak.sh: $passed of $n passed, $reads failed single-copy reads in all (logs: $out)"
[ "$passed" = "$n" ] && [ "$reads" = 0 ]
