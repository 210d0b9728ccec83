#!/bin/bash
# Runs a command with N busy, not niced, CPU-burning processes beside it (the slow-machine condition of CI's
# 2-core runners), then stops them, whatever the command did. Prints the command's wall time and exits with
# its status.
#   bench/with_load.sh N COMMAND [ARG...]
#   e.g. bench/with_load.sh 2 scripts/test        (the README's test command, loaded)
set -uo pipefail
[[ "${1:-}" =~ ^[0-9]+$ ]] && [ $# -ge 2 ] || { echo "usage: bench/with_load.sh N COMMAND [ARG...]" >&2; exit 2; }
n=$1
shift
burners=()
stop() { [ ${#burners[@]} -eq 0 ] || kill "${burners[@]}" 2>/dev/null; wait "${burners[@]}" 2>/dev/null; burners=(); }
trap 'stop; exit 130' INT TERM
for _ in $(seq "$n"); do
  bash -c 'while :; do :; done' &
  burners+=($!)
done
start=$(date +%s)
"$@"
rc=$?
stop
echo "bench/with_load.sh: '$*' with $n CPU burners: exit $rc after $(( $(date +%s) - start )) s"
exit $rc
