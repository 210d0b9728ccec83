#!/bin/sh
# ctest fixture: start the local cluster with the built plugin (setup), or check that no node is drained
# and stop it (cleanup). Usage: cluster.sh up|down  (environment from tests/slurm/CMakeLists.txt)
set -u
[ "$(id -u)" = 0 ] || { echo "SKIP: the local Slurm cluster needs root (slurmd, mknod)"; exit 77; }
for daemon in slurmd slurmctld munged; do
  command -v $daemon >/dev/null ||
    { echo "SKIP: $daemon not installed (apt-get install slurm-wlm slurmd slurmctld munge)"; exit 77; }
done
case ${1:-} in
  up)
    timeout 60 "$SRC/scripts/local-slurm" down --dir "$LAB" >/dev/null 2>&1   # leftovers of an aborted run
    rm -rf "$LAB/jobs" "$LAB/state" "$LAB/log"   # (also the sanitizer logs of an earlier run)
    exec timeout 120 "$SRC/scripts/local-slurm" up --dir "$LAB" --debug --plugin "$PLUGIN" \
      --plugin-args "topology_xml=$TOPOLOGY_XML"
    ;;
  down)
    rc=0
    state=$(timeout 20 sinfo -h -N -o '%N %T' 2>&1)
    echo "$state"
    if echo "$state" | grep -Eiq 'drain|down|fail|error'; then
      echo "FAIL: a node is drained or down after the tests:" >&2
      timeout 20 sinfo -N -o '%N %T %E' >&2
      rc=1
    fi
    # Sanitizer runs: any ASan/UBSan report of the plugin inside slurmd or slurmstepd fails the run.
    if ls "$LAB"/log/sanitizer.* >/dev/null 2>&1; then
      echo "FAIL: sanitizer reports from slurmd/slurmstepd:" >&2
      head -n 40 "$LAB"/log/sanitizer.* >&2
      rc=1
    fi
    # The per-task cost of the plugin's task_init, from the slurmstepd debug log (the number for docs).
    grep -ho 'task_init rank [0-9]* took [0-9]* us (cpu [0-9]* us)' "$LAB"/log/slurmd-n*.log 2>/dev/null |
      awk '{ us = $5; cpu += $8; n++; s += us; if (us > m) m = us } END { if (n) printf "task_init: %d tasks, mean %.0f us (cpu %.0f us), max %d us\n", n, s / n, cpu / n, m }'
    timeout 60 "$SRC/scripts/local-slurm" down --dir "$LAB" || rc=1
    exit $rc
    ;;
  *) echo "usage: cluster.sh up|down" >&2; exit 2 ;;
esac
