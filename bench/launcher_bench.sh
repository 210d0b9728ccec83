#!/bin/bash
# Wall time of the launcher's per-task and per-job work (median and min of N runs):
#   meshrun exec (config + topology + compute_task_env + exec of /bin/true), live hwloc and XML topology;
#   meshrun sbatch --dry-run and meshrun plan --format svg for llama3-405b (16,384 and 131,072 GPUs).
# usage: bench/launcher_bench.sh [MESHRUN] [RUNS]   (from the repository root; default build/launcher/meshrun, 20)
set -euo pipefail
bin=${1:-build/launcher/meshrun}
runs=${2:-20}
out=/tmp/meshrun-launcher-bench.out

measure() {
  local label=$1
  shift
  local times=()
  for _ in $(seq "$runs"); do
    local t0 t1
    t0=$(date +%s%N)
    env -i PATH=/usr/bin:/bin "$@" >"$out" 2>/dev/null
    t1=$(date +%s%N)
    times+=($(( (t1 - t0) / 1000 )))
  done
  local sorted min median
  sorted=$(printf '%s\n' "${times[@]}" | sort -n)
  min=$(echo "$sorted" | head -1)
  median=$(echo "$sorted" | sed -n "$(( (runs + 1) / 2 ))p")
  awk -v l="$label" -v med="$median" -v mn="$min" -v b="$(stat -c %s "$out")" \
    'BEGIN { printf "%-58s median %8.1f ms   min %8.1f ms   output %7.1f kB\n", l, med / 1000, mn / 1000, b / 1e3 }'
}

xml=tests/topology/fixtures/dgx-h100.xml
slurm=(SLURM_PROCID=13 SLURM_NTASKS=16 SLURM_LOCALID=5 SLURM_NODEID=1 SLURM_JOB_ID=77 SLURM_STEP_ID=0
       SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='gpu[01-02]' SLURM_STEP_TASKS_PER_NODE='8(x2)'
       SLURM_STEP_GPUS=0,1,2,3,4,5,6,7)
tmpl=$(mktemp /tmp/meshrun-bench-XXXXXX.toml)
trap 'rm -f "$tmpl" "$out"' EXIT
printf '[cluster]\nnode_type = "dgx-h100"\n[parallel]\ntp = 2\npp = 2\ndp = "auto"\n[training]\nglobal_batch_size = 8\n' >"$tmpl"

measure "baseline: /bin/true" /bin/true
measure "exec, tiny, --rank 0 --world-size 4, live hwloc topology" \
  "$bin" exec --no-site --template templates/tiny.toml --rank 0 --world-size 4 -- /bin/true
measure "exec, 2 x 8 dgx-h100 Slurm task, XML topology" \
  env "${slurm[@]}" "$bin" exec --no-site --template "$tmpl" --topology "$xml" -- /bin/true
measure "sbatch --dry-run llama3-405b (16,384 GPUs)" \
  "$bin" sbatch --no-site --plugin no --cpus-per-task 16 templates/llama3-405b.toml --dry-run
measure "plan --format svg llama3-405b (16,384 GPUs)" "$bin" plan --no-site templates/llama3-405b.toml --format svg
measure "plan --format svg llama3-405b (131,072 GPUs)" \
  "$bin" plan --no-site templates/llama3-405b.toml --nodes 16384 --set cluster.hostlist= \
  --set training.global_batch_size=16384 --format svg
