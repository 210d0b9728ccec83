#!/bin/sh
# Per-task cost of the SPANK plugin's task_init (and the once-per-node topology load in user_init), measured
# inside slurmstepd on the local cluster and read back from its debug log. Needs root and a built plugin.
#
#   bench/plugin_task_init.sh BUILD_DIR [ROUNDS] [live|TOPOLOGY.xml]
#
# Each round runs `srun -N4 --ntasks-per-node=8 --gpus-per-node=8 --mesh-tp=8 true` (32 tasks).
set -eu
BUILD=$(cd "${1:?usage: plugin_task_init.sh BUILD_DIR [ROUNDS] [live|TOPOLOGY.xml]}" && pwd)
ROUNDS=${2:-10}
SRC=$(cd "$(dirname "$0")/.." && pwd)
TOPO=${3:-$SRC/tests/topology/fixtures/dgx-h100.xml}
LAB=$(mktemp -d /tmp/meshrun-bench-slurm.XXXXXX)
ARGS=""
[ "$TOPO" = live ] || ARGS="topology_xml=$TOPO"
export LOCAL_SLURM_PORT=${LOCAL_SLURM_PORT:-29000}
trap '"$SRC/scripts/local-slurm" down --dir "$LAB" >/dev/null; rm -rf "$LAB"' EXIT
"$SRC/scripts/local-slurm" up --dir "$LAB" --debug --plugin "$BUILD/plugin/spank_meshrun.so" --plugin-args "$ARGS" >/dev/null
export SLURM_CONF=$LAB/etc/slurm.conf
i=0
while [ $i -lt "$ROUNDS" ]; do
  timeout 60 srun -N4 --ntasks-per-node=8 --gpus-per-node=8 --mesh-tp=8 true
  i=$((i + 1))
done
echo "topology: $TOPO, rounds: $ROUNDS"
stats() {  # $1 = label; numbers on stdin
  sort -n | awk -v label="$1" '{ v[NR] = $1; s += $1 } END { printf "%s: %d tasks, mean %.0f us, median %d us, p95 %d us, max %d us\n",
       label, NR, s / NR, v[int((NR + 1) / 2)], v[int(NR * 0.95 + 0.5)], v[NR] }'
}
grep -ho 'task_init rank [0-9]* took [0-9]* us (cpu [0-9]* us)' "$LAB"/log/slurmd-n*.log >"$LAB/times"
awk '{ print $5 }' "$LAB/times" | stats "task_init wall"
awk '{ print $8 }' "$LAB/times" | stats "task_init cpu "
grep -ho 'loaded the topology ([^)]*) in [0-9.]* ms' "$LAB"/log/slurmd-n*.log | awk '{ print $(NF - 1) }' | sort -n |
  awk '{ v[NR] = $1; s += $1 } END { printf "user_init topology load: %d loads, mean %.1f ms, max %.1f ms\n", NR, s / NR, v[NR] }'
