#!/bin/bash
# Integration checks of the SPANK plugin on the local cluster (ctest label `slurm`). Usage: checks.sh NAME.
# Every command runs under `timeout`; checks look at output, not only exit codes (Slurm reports rc=0 for
# some plugin failures).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root"; exit 77; }
command -v slurmd >/dev/null || { echo "SKIP: slurmd not installed"; exit 77; }
[ -f "$SLURM_CONF" ] || { echo "FAIL: no cluster config at $SLURM_CONF (did the slurm_cluster_up fixture run?)"; exit 1; }
export SLURM_CONF
NAME=${1:?usage: checks.sh NAME}
WORK=$LAB/jobs/$NAME.$$
mkdir -p "$WORK" && cd "$WORK" || exit 1
for v in $(env | grep -o '^SLURM_SPANK[A-Za-z0-9_]*'); do unset "$v"; done   # never inherit a caller's options

T() { timeout "${LIMIT:-60}" "$@"; }
# A memory cap on every client command (srun, sbatch, salloc, meshrun) so a regression such as reading
# /dev/zero fails instead of exhausting the machine; the tasks run under slurmstepd, outside this cap.
. "$(dirname "$0")/../sanitize/vmem_cap.sh"  # vmem_cap KIB: ulimit -v, except in the sanitizer build
vmem_cap 8000000 2>/dev/null || echo "note: could not set a memory cap (ulimit -v)"
fail() { echo "FAIL: $*" >&2; exit 1; }
say() { echo "-- $*"; }

job_count() { T scontrol show job -o 2>/dev/null | grep -c '^JobId=' ; }
wait_job() {  # polls squeue (sbatch --wait is slow to notice the end)
  for _ in $(seq 600); do
    [ -z "$(T squeue -h -j "$1" 2>/dev/null)" ] && return 0
    sleep 0.1
  done
  T scancel "$1"; fail "job $1 still running after 60 s"
}
job_state() { T scontrol show job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }
# submit ARGS...: sbatch, wait for the end, print the job id.
submit() {
  local out
  out=$(T sbatch --parsable -o "$WORK/job-%j.out" "$@") || fail "sbatch $* was refused: $out"
  wait_job "${out%%;*}"
  echo "${out%%;*}"
}
# expect_refused PATTERN COMMAND...: non-zero exit, PATTERN in the output, and no job created.
expect_refused() {
  local pattern=$1; shift
  local before out rc
  before=$(job_count)
  out=$(T "$@" 2>&1); rc=$?
  [ $rc -ne 0 ] || fail "accepted: $* (output: $out)"
  echo "$out" | grep -q -- "$pattern" || fail "'$*' failed without '$pattern'; output: $out"
  echo "$out" | grep -q 'Submitted batch job' && fail "a job was submitted by: $*"
  [ "$(job_count)" = "$before" ] || fail "a job was created by: $*"
  say "refused (rc=$rc): $* -> $(echo "$out" | grep -m1 -- "$pattern")"
}
# plan_for NODES GPUS_PER_NODE HOSTLIST ARGS...: the plan JSON the tasks must match.
plan_for() {
  local nodes=$1 gpn=$2 hosts=$3; shift 3
  [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
  T "$MESHRUN_BIN" plan --no-site --nodes "$nodes" --gpus-per-node "$gpn" --set "cluster.hostlist=$hosts" \
    --format json "$@" >plan.json || fail "meshrun plan $* failed"
}
hostlist_of() { grep -m1 -o 'SLURM_JOB_NODELIST=[^ ]*' "$1" | cut -d= -f2; }
compare() {
  command -v python3 >/dev/null || fail "python3 is needed to compare environments (apt-get install python3)"
  T python3 "$HERE/compare_env.py" "$1" plan.json || fail "task environments differ from the plan"
}


# meshrun preflight on the allocation's 4 nodes × 2 tasks (tiny: tp 2 × dp 4), each task under meshrun exec (which
# binds it as the rank map says), over pmix with Open MPI as `local-slurm env` configures it (the UCX PML).
preflight_step() {
  [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
  eval "$("$SRC/scripts/local-slurm" env --dir "$LAB")"
  LIMIT=${LIMIT:-90} T srun --mpi=pmix -N 4 --ntasks-per-node=2 ${SRUN_EXTRA:-} "$MESHRUN_BIN" exec --no-site --template "$SRC/templates/tiny.toml" \
    -- "$MESHRUN_BIN" preflight --no-site "$SRC/templates/tiny.toml" "$@"
}
# Open MPI 4.1's TCP transport crashes now and then on this 2-core host (see mpi_pmix); a run whose output shows
# such a crash is retried once, with core files kept in the check's directory for a look (gdb meshrun-preflight core).
mpi_crashed() { echo "$1" | grep -Eq 'Segmentation fault|Signal: Segmentation|Bus error'; }
# The row of NODE's CHECK in a preflight table.
preflight_row() { echo "$1" | grep -E "^$2 +$3 " ; }
# throttle PID PERCENT: moves PID (a slurmd: its steps and tasks inherit it) into a new cgroup limited to PERCENT
# of one CPU (cgroup v2 cpu.max, else v1 cpu.cfs_quota_us; 20 ms periods). Sets THROTTLED; unthrottle undoes it.
THROTTLED=""
throttle() {
  local pid=$1 quota=$(($2 * 200)) dir
  if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null && [ -w /sys/fs/cgroup/cgroup.subtree_control ]; then
    dir=/sys/fs/cgroup/meshrun-throttle.$$
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
    mkdir "$dir" && echo "$quota 20000" >"$dir/cpu.max" && echo "$pid" >"$dir/cgroup.procs" || { rmdir "$dir" 2>/dev/null; return 1; }
  elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
    dir=/sys/fs/cgroup/cpu/meshrun-throttle.$$
    mkdir "$dir" && echo 20000 >"$dir/cpu.cfs_period_us" && echo "$quota" >"$dir/cpu.cfs_quota_us" &&
      echo "$pid" >"$dir/cgroup.procs" || { rmdir "$dir" 2>/dev/null; return 1; }
  else
    return 1
  fi
  THROTTLED="$pid $dir"
  trap unthrottle EXIT
}
unthrottle() {
  [ -n "$THROTTLED" ] || return 0
  set -- $THROTTLED
  echo "$1" >"$(dirname "$2")/cgroup.procs"
  for _ in $(seq 50); do rmdir "$2" 2>/dev/null && break; sleep 0.1; done
  THROTTLED=""
}

case $NAME in
  options_listed)
    for cmd in sbatch srun salloc; do
      help=$(T $cmd --help 2>&1)
      for o in mesh-tp mesh-cp mesh-pp mesh-dp mesh-ep mesh-order mesh-template mesh-env mesh-dry-run mesh-off mesh-preflight; do
        echo "$help" | grep -q -- "--$o" || fail "$cmd --help does not list --$o"
      done
    done
    say "sbatch, srun and salloc list all 11 --mesh-* options"
    ;;

  env_matches_plan_2nodes)
    id=$(submit -N 2 --ntasks-per-node=4 --gpus-per-node=4 --mesh-tp=2 --mesh-pp=2 --mesh-dp=2 \
      --wrap "srun $HERE/dump_env.sh")
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id: $(job_state "$id"); $(cat job-$id.out)"
    plan_for 2 4 "$(hostlist_of job-$id.out)" --mesh-tp 2 --mesh-pp 2 --mesh-dp 2
    compare "job-$id.out"
    ;;

  env_matches_plan_4nodes)
    id=$(submit -N 4 --ntasks-per-node=4 --gpus-per-node=4 --mesh-tp=2 --mesh-pp=2 --mesh-dp=auto \
      --mesh-order=tp-cp-pp-dp --wrap "srun $HERE/dump_env.sh")
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id: $(job_state "$id"); $(cat job-$id.out)"
    plan_for 4 4 "$(hostlist_of job-$id.out)" --mesh-tp 2 --mesh-pp 2 --mesh-dp auto --mesh-order tp-cp-pp-dp
    compare "job-$id.out"
    grep -q 'MESHRUN_DP_SIZE=4' "job-$id.out" || fail "dp=auto did not resolve to 4"
    ;;

  template_with_overrides)
    # tiny.toml says tp=2, dp=auto; the flag --mesh-tp=1 wins, the template's model is checked.
    cp "$SRC/templates/tiny.toml" job.toml
    # A relative path: the nodes resolve it against the step's working directory.
    id=$(submit -N 2 --ntasks-per-node=2 --mesh-template=job.toml --mesh-tp=1 --wrap "srun $HERE/dump_env.sh")
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id: $(job_state "$id"); $(cat job-$id.out)"
    plan_for 2 2 "$(hostlist_of job-$id.out)" "$WORK/job.toml" --mesh-tp 1
    compare "job-$id.out"
    grep -q 'MESHRUN_TP_SIZE=1' "job-$id.out" || fail "--mesh-tp=1 did not override the template"
    # Relative template path, and a model check only the template makes possible (tiny has 2 KV heads).
    expect_refused 'kv_heads' sbatch -N 1 --ntasks-per-node=4 --mesh-template=job.toml --mesh-tp=4 --mesh-dp=1 --wrap true
    printf '[parallel]\ntp = 2\ntensor = 4\n' >bad.toml
    expect_refused 'bad.toml' sbatch -N 1 --ntasks-per-node=2 --mesh-template=bad.toml --wrap true
    expect_refused 'missing.toml' srun -N 1 -n 2 --mesh-template=missing.toml true
    # The relative path is made absolute at submission: a script that changes directory still finds it.
    mkdir -p elsewhere
    id=$(submit -N 1 --ntasks-per-node=2 --mesh-template=job.toml --wrap 'cd elsewhere && srun printenv MESHRUN_TP_SIZE')
    [ "$(grep -c '^2$' "job-$id.out")" = 2 ] || fail "relative template lost after cd in the script: $(cat job-$id.out)"
    out=$(cd elsewhere && T salloc -N 1 -n 2 --mesh-template=../job.toml bash -c 'cd / && srun printenv MESHRUN_TP_SIZE' 2>&1)
    [ "$(echo "$out" | grep -c '^2$')" = 2 ] || fail "salloc: relative template lost after cd: $out"
    ;;

  bad_files_refused)
    # Templates must be regular files of at most 1 MiB: /dev/zero grew sbatch to 3.9 GB and never returned, a
    # FIFO hung. Memory-capped so a regression fails instead of exhausting the machine; timeouts bound hangs.
    mkfifo fifo.toml
    head -c 2000000 /dev/zero | tr '\0' '#' >big.toml
    for f in /dev/zero "$WORK/fifo.toml" "$WORK/big.toml" "$WORK"; do
      out=$( (vmem_cap 1000000; LIMIT=20 T sbatch -N 1 --mesh-template="$f" --wrap true) 2>&1); rc=$?
      [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "sbatch --mesh-template=$f: rc=$rc (124 = hung): $out"
      echo "$out" | grep -Eq 'not a regular file|larger than 1 MiB' || fail "sbatch --mesh-template=$f: no clear line: $out"
      echo "$out" | grep -q 'Submitted' && fail "a job was submitted with --mesh-template=$f"
      out=$( (vmem_cap 1000000; LIMIT=20 T srun -N 1 --mesh-template="$f" true) 2>&1); rc=$?
      [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "srun --mesh-template=$f: rc=$rc: $out"
      say "refused: --mesh-template=$f -> $(echo "$out" | grep -m1 -o 'meshrun: .*')"
    done
    # A 10,000-character bad value is cut to 60 characters and "…" in meshrun's line.
    long=$(head -c 10000 /dev/zero | tr '\0' 'x')
    out=$(T sbatch -N 1 --mesh-order="$long" --wrap true 2>&1)
    line=$(echo "$out" | grep 'meshrun:')
    [ -n "$line" ] || fail "no meshrun line for a long --mesh-order: $(echo "$out" | head -c 300)"
    [ ${#line} -lt 400 ] || fail "meshrun echoed the long value (${#line} characters)"
    echo "$line" | grep -q '…' || fail "no '…' in the cut value: $line"
    ;;

  sbatch_directives)
    cat >job.sh <<EOS
#!/bin/sh
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --mesh-tp=2
#SBATCH --mesh-order=tp-cp-ep-dp-pp
srun $HERE/dump_env.sh
EOS
    id=$(submit job.sh)
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id: $(job_state "$id"); $(cat job-$id.out)"
    plan_for 2 2 "$(hostlist_of job-$id.out)" --mesh-tp 2
    compare "job-$id.out"
    # The shape comes from the #SBATCH lines too: tp=4 cannot fit 2 tasks per node.
    sed 's/--mesh-tp=2/--mesh-tp=4/' job.sh >bad.sh
    expect_refused 'tp=4 spans more than one node' sbatch bad.sh
    # ... and the command line wins over them: 4 tasks per node make tp=4 valid.
    id=$(submit --ntasks-per-node=4 bad.sh)
    [ "$(grep -c 'MESHRUN_TP_SIZE=4' job-$id.out)" = 8 ] || fail "expected 8 tasks with tp=4: $(cat job-$id.out)"
    say "#SBATCH --mesh-* lines apply; command line overrides them"
    ;;

  het_step)
    # A heterogeneous step: ranks and world are global across its two components.
    T srun -N 1 -n 2 --mesh-tp=2 "$HERE/dump_env.sh" : -N 1 -n 2 "$HERE/dump_env.sh" >dump.txt 2>err.txt ||
      fail "het step failed: $(cat err.txt)"
    hosts=$(awk '/^MESHENV/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
                              print v["SLURM_NODEID"], v["SLURMD_NODENAME"] }' dump.txt | sort -un | cut -d' ' -f2 | paste -sd, -)
    plan_for 2 2 "$hosts" --mesh-tp 2
    compare dump.txt
    [ "$(grep -o 'MASTER_ADDR=[^ ]*' dump.txt | sort -u | wc -l)" = 1 ] || fail "components disagree on MASTER_ADDR"
    [ "$(grep -o 'MASTER_PORT=[^ ]*' dump.txt | sort -u | wc -l)" = 1 ] || fail "components disagree on MASTER_PORT"
    # Unequal components (the issue: every task failed with "tp=2 does not divide gpus_per_node=3; use tp in
    # {1, 3}", a fix that fails too, printed once per task): one line naming the sizes, nothing runs.
    out=$(T srun -n 2 --mesh-tp=2 touch "$WORK/ran" : -n 4 touch "$WORK/ran" 2>&1)
    echo "$out"
    [ "$(echo "$out" | grep -c 'meshrun: ')" = 1 ] || fail "unequal het step: not exactly one meshrun line: $out"
    echo "$out" | grep -q 'meshrun: a heterogeneous step whose nodes run 2 and 4 tasks' || fail "no sizes named: $out"
    echo "$out" | grep -q 'does not divide' && fail "the misleading tp message is back: $out"
    # With the node counts on the command line srun refuses before the step, naming a layout that fits ...
    expect_refused 'e.g. srun -N1 --ntasks-per-node=2 --mesh-tp=2 : -N2 --ntasks-per-node=2 (6 ranks' \
      srun -N 1 -n 2 --mesh-tp=2 touch "$WORK/ran" : -N 1 -n 4 touch "$WORK/ran"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "a task of an unequal het step ran"
    # ... and that layout runs.
    out=$(T srun -N1 --ntasks-per-node=2 --mesh-tp=2 printenv MESHRUN_LAYOUT : -N2 --ntasks-per-node=2 printenv MESHRUN_LAYOUT 2>&1)
    [ "$(echo "$out" | grep -c '^tp=2,cp=1,pp=1,dp=3,ep=1$')" = 6 ] || fail "the suggested het layout does not run: $out"
    ;;

  bad_layouts_refused)
    expect_refused '16 ranks but the job has 8 tasks' sbatch -N 2 --ntasks-per-node=4 --mesh-tp=2 --mesh-pp=2 --mesh-dp=4 --wrap true
    expect_refused '16 ranks but the job has 8 tasks' srun -N 2 --ntasks-per-node=4 --mesh-tp=2 --mesh-pp=2 --mesh-dp=4 true
    expect_refused 'does not divide the job' srun -N 2 --ntasks-per-node=2 --mesh-tp=2 --mesh-pp=3 true
    expect_refused 'tp=8 spans more than one node' sbatch -N 2 --ntasks-per-node=4 --gpus-per-node=4 --mesh-tp=8 --wrap true
    expect_refused 'tp=8 spans more than one node' srun -N 2 --ntasks-per-node=4 --gpus-per-node=4 --mesh-tp=8 true
    expect_refused '4 tasks per node but only 2 GPUs' sbatch -N 1 --ntasks-per-node=4 --gpus-per-node=2 --mesh-tp=2 --wrap true
    expect_refused "mesh-tp='abc' is not a valid size" sbatch -N 1 --mesh-tp=abc --wrap true
    expect_refused "mesh-dp='-1' is not a valid size" srun -N 1 --mesh-dp=-1 true
    expect_refused "mesh-pp='0' is not a valid size" salloc -N 1 --mesh-pp=0 true
    expect_refused 'mesh-order' sbatch -N 1 --mesh-order=tp-zz --wrap true
    # --mesh-env's policy at submission, naming the flag (it was checked only in slurmstepd, per task, after
    # the job was queued, and the message blamed a template).
    expect_refused '--mesh-env sets LD_PRELOAD, which makes tasks load or run other code' sbatch -N 1 --mesh-tp=1 \
      --mesh-env=LD_PRELOAD=/tmp/x.so --wrap true
    expect_refused '--mesh-env sets RANK, which meshrun computes for each task' srun -N 1 --mesh-env=RANK=3 true
    expect_refused '--mesh-env sets PATH' salloc -N 1 --mesh-env=PATH=/tmp true
    # Slurm echoes a value an option callback refuses, whole ("Invalid --mesh-tp argument: VALUE"): a long or
    # unprintable one is refused in init_post_opt instead, so only meshrun's cut, escaped line shows it.
    long=$(printf '9%.0s' $(seq 300)) hundred=$(printf '9%.0s' $(seq 100))
    for c in "sbatch -N 1 --wrap true" "srun -N 1 true" "salloc -N 1 true"; do
      set -- $c
      expect_refused "is not a valid size" "$1" --mesh-tp="$long" "${@:2}"
      out=$(T "$1" --mesh-tp="$long" "${@:2}" 2>&1)
      echo "$out" | grep -q "$hundred" && fail "$1 echoed the 300-digit value whole: $(echo "$out" | cut -c1-200)"
    done
    out=$(T srun -N 1 --mesh-tp=$'2\e[31m' true 2>&1)
    [[ $out == *$'\e'* ]] && fail "srun printed the ESC byte of --mesh-tp"
    echo "$out" | grep -qF -- "--mesh-tp='2\x1b[31m' is not a valid size" || fail "no escaped refusal: $out"
    say "a 300-digit --mesh-tp is refused by sbatch, srun and salloc without Slurm echoing it; an ESC is escaped"
    # A value-taking option swallows the next token: srun passes it to the plugin, which refuses it; sbatch
    # rejects the leftover word as a script before plugins see their options.
    expect_refused 'mesh-template needs a TOML file' srun -N 1 --mesh-template --label true
    expect_refused 'does not look like a batch script' sbatch -N 1 --mesh-template --wrap true
    expect_refused 'do not spread evenly' sbatch -N 3 -n 8 --mesh-tp=2 --wrap true
    # Inside an allocation srun's step is checked in init_post_opt, from its arguments and SLURM_* variables.
    id=$(submit -N 2 --ntasks-per-node=2 --wrap 'srun --mesh-tp=4 true; echo "srun rc=$?"')
    grep -q 'meshrun: tp=4 spans more than one node' "job-$id.out" || fail "in-job srun not refused: $(cat job-$id.out)"
    grep -q 'srun rc=[1-9]' "job-$id.out" || fail "in-job srun returned 0: $(cat job-$id.out)"
    # Without any --mesh-* option the plugin stays out of the way.
    out=$(T srun -N 2 --ntasks-per-node=3 printenv SLURM_PROCID | sort | tr '\n' ' ')
    [ "$out" = "0 1 2 3 4 5 " ] || fail "plain srun broken with the plugin loaded: '$out'"
    ;;

  bad_configs_plugin)
    # The sixth consumer of the table of bad configurations (tests/common/bad_configs.py; the other five are in
    # tests/launcher/bad_configs.sh): srun and sbatch with --mesh-template refuse every row before any task
    # starts, with the row's own line.
    python3 "$SRC/tests/common/bad_configs.py" "$SRC/templates" "$WORK" >"$WORK/table" || fail "the table"
    n=0
    while IFS=$'\t' read -r name line; do
      expect_refused "$line" srun -N 1 --ntasks-per-node=4 --mesh-template="$WORK/$name.toml" true
      expect_refused "$line" sbatch -N 1 --ntasks-per-node=4 --mesh-template="$WORK/$name.toml" --wrap true
      n=$((n + 1))
    done <"$WORK/table"
    [ "$n" -ge 6 ] || fail "the table has $n rows"
    # The unmodified template is accepted (so the refusals are the rows', not the plugin's).
    out=$(T srun -N 1 --ntasks-per-node=4 --mesh-template="$SRC/templates/tiny.toml" printenv MESHRUN_LAYOUT 2>&1 | sort -u)
    [ "$out" = "tp=2,cp=1,pp=1,dp=2,ep=1" ] || fail "tiny itself: $out"
    say "$n bad configurations refused by srun and sbatch --mesh-template with the table's lines; tiny accepted"
    ;;

  dry_run)
    out=$(T srun -N 2 --ntasks-per-node=4 --mesh-tp=2 --mesh-pp=2 --mesh-dry-run touch "$WORK/ran" 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] || fail "dry run must stop srun (rc=$rc)"
    echo "$out" | grep -q '8 ranks on 2 nodes' || fail "no rank map printed"
    echo "$out" | grep -q 'r7\[gpu3 tp1 cp0 pp1 dp1 ep0\]' || fail "rank 7's coordinates missing"
    echo "$out" | grep -q 'nothing launched' || fail "no 'nothing launched' line"
    # Outside an allocation no node is chosen yet: numbered nodes, no made-up host names (f3355c0 showed node0000).
    echo "$out" | grep -q '^  node 1: r4\[' || fail "outside an allocation the nodes must be numbered without host names"
    echo "$out" | grep -q '(node0' && fail "the dry run shows made-up host names"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "the dry run launched the command"
    out=$(T sbatch -N 2 --ntasks-per-node=4 --mesh-tp=2 --mesh-dry-run --wrap "touch $WORK/ran" 2>&1)
    echo "$out" | grep -q '8 ranks on 2 nodes' || fail "sbatch dry run printed no map: $out"
    echo "$out" | grep -q 'Submitted' && fail "sbatch --mesh-dry-run queued a job"
    say "dry runs printed the map and launched nothing"
    ;;

  inherit_and_override)
    id=$(submit -N 1 --ntasks-per-node=4 --mesh-tp=2 --wrap \
      'echo "BATCH RANK=${RANK:-unset} TP=${MESHRUN_TP_SIZE:-unset}"
       srun sh -c "echo INHERITED \$MESHRUN_TP_SIZE"
       srun --mesh-tp=4 sh -c "echo OVERRIDE \$MESHRUN_TP_SIZE"
       srun --mesh-off sh -c "echo OFF \${MESHRUN_TP_SIZE:-unset}"')
    f=job-$id.out
    cat "$f"
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id: $(job_state "$id")"
    grep -q 'BATCH RANK=unset TP=unset' "$f" || fail "the batch step must not get rank variables"
    [ "$(grep -c '^INHERITED 2$' "$f")" = 4 ] || fail "sbatch --mesh-tp=2 did not reach the script's srun"
    [ "$(grep -c '^OVERRIDE 4$' "$f")" = 4 ] || fail "srun --mesh-tp=4 did not override the inherited option"
    [ "$(grep -c '^OFF unset$' "$f")" = 4 ] || fail "srun --mesh-off did not disable the plugin"
    out=$(T salloc -N 1 --ntasks-per-node=2 --mesh-tp=2 srun printenv MESHRUN_TP_SIZE 2>/dev/null | tr '\n' ' ')
    [ "$out" = "2 2 " ] || fail "salloc --mesh-tp=2 did not reach its srun: '$out'"
    say "sbatch and salloc options reach their steps; a step overrides or opts out"
    ;;

  remote_failure_fails_task)
    # A cyclic distribution breaks the block placement the map assumes. srun refuses the whole step before it
    # exists, with one line naming the supported distribution; no task runs (the issue: ranks 0 and 3 ran and
    # kept running without --kill-on-bad-exit). Inside a batch job too, and from SLURM_DISTRIBUTION.
    expect_refused 'use --distribution=block' srun -N 2 --ntasks-per-node=2 --distribution=cyclic --mesh-tp=2 touch "$WORK/ran"
    out=$(T srun -N 2 --ntasks-per-node=2 --distribution=cyclic --mesh-tp=2 touch "$WORK/ran" 2>&1)
    [ "$(echo "$out" | grep -c 'meshrun: ')" = 1 ] || fail "cyclic: not exactly one meshrun line: $out"
    id=$(submit -N 2 --ntasks-per-node=2 --mesh-tp=2 --wrap "srun --distribution=cyclic touch $WORK/ran; echo \"srun rc=\$?\"
      SLURM_DISTRIBUTION=cyclic srun touch $WORK/ran; echo \"env srun rc=\$?\"")
    cat "job-$id.out"
    grep -q 'meshrun: --distribution=cyclic places tasks' "job-$id.out" || fail "batch job output lacks the message: $(cat job-$id.out)"
    grep -q 'meshrun: SLURM_DISTRIBUTION=cyclic places tasks' "job-$id.out" || fail "SLURM_DISTRIBUTION not checked: $(cat job-$id.out)"
    grep -q '^srun rc=[1-9]' "job-$id.out" || fail "srun inside the batch job returned 0"
    grep -q '^env srun rc=[1-9]' "job-$id.out" || fail "srun with SLURM_DISTRIBUTION=cyclic returned 0"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "a task of a cyclic step ran its command (partial launch)"
    # Tasks Slurm spread unevenly (srun -N2 -n4 packs 3 + 1 here): the node side sees it; every task fails,
    # not only those of the node with the odd count.
    out=$(T srun -N 2 -n 4 --mesh-tp=2 touch "$WORK/ran" 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] || fail "uneven placement accepted (rc=0)"
    echo "$out" | grep -q 'meshrun: ' || fail "no meshrun message for the failed tasks"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "a task of an unevenly placed step ran its command"
    state=$(T sinfo -h -o '%T' | sort -u | tr '\n' ' ')
    echo "$state" | grep -Eq 'drain|down' && fail "nodes drained: $state"
    say "remote failure reported to the user, nodes: $state"
    ;;

  broken_topology_no_drain)
    # Point the plugin at a missing topology file (plugstack.conf is re-read per launch). Loading fails in
    # user_init, where failing would report rc=0 to srun and drain the node in a batch job; the plugin
    # fails the tasks instead, with the message, and the nodes stay up.
    conf=$LAB/etc/plugstack.conf
    cp "$conf" "$WORK/plugstack.good"
    trap 'cp "$WORK/plugstack.good" "$conf.tmp" && mv -f "$conf.tmp" "$conf"' EXIT
    sed "s|topology_xml=[^ ]*|topology_xml=$WORK/missing.xml|" "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"
    out=$(T srun -N 2 --ntasks-per-node=2 --mesh-tp=2 echo TASK-RAN 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] || fail "srun returned 0 with a broken topology"
    echo "$out" | grep -q 'meshrun: .*missing.xml' || fail "no message naming the topology file"
    echo "$out" | grep -q TASK-RAN && fail "a task ran without its environment"
    id=$(submit -N 2 --ntasks-per-node=2 --mesh-tp=2 --wrap 'echo BATCH-RAN; srun echo TASK-RAN; echo "srun rc=$?"')
    cat "job-$id.out"
    grep -q BATCH-RAN "job-$id.out" || fail "the batch script did not run"
    grep -q 'srun rc=[1-9]' "job-$id.out" || fail "srun in the batch job returned 0"
    out=$(T srun -N 2 --ntasks-per-node=2 echo PLAIN-RAN 2>&1)
    [ "$(echo "$out" | grep -c PLAIN-RAN)" = 4 ] || fail "jobs without --mesh-* options must still run: $out"
    state=$(T sinfo -h -o '%T' | sort -u | tr '\n' ' ')
    echo "$state" | grep -Eq 'drain|down' && fail "nodes drained: $state"
    # XML that crashes libhwloc itself: slurmstepd (root) must survive it; the tasks fail with the message.
    crash=$HERE/../topology/fixtures/malformed/root-without-complete-cpuset.xml
    sed "s|topology_xml=[^ ]*|topology_xml=$crash|" "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"
    out=$(T srun -N 2 --ntasks-per-node=2 --mesh-tp=2 echo TASK-RAN 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] || fail "srun returned 0 with a topology that crashes hwloc"
    echo "$out" | grep -q 'meshrun: topology XML .*root-without-complete-cpuset.xml: libhwloc crashed reading it (signal 11)' ||
      fail "no message naming the crash"
    echo "$out" | grep -q TASK-RAN && fail "a task ran without its environment"
    out=$(T srun -N 2 --ntasks-per-node=2 echo PLAIN-RAN 2>&1)
    [ "$(echo "$out" | grep -c PLAIN-RAN)" = 4 ] || fail "after the crashing XML, jobs without --mesh-* no longer run: $out"
    state=$(T sinfo -h -o '%T' | sort -u | tr '\n' ' ')
    echo "$state" | grep -Eq 'drain|down' && fail "nodes drained after the crashing XML: $state"
    say "broken topology: tasks failed with the message, nodes $state"
    ;;

  plugstack_args)
    # Site arguments on the plugstack line reach the tasks; an unknown one stops srun and sbatch at load.
    conf=$LAB/etc/plugstack.conf
    cp "$conf" "$WORK/plugstack.good"
    trap 'cp "$WORK/plugstack.good" "$conf.tmp" && mv -f "$conf.tmp" "$conf"' EXIT
    with_args() { sed "s|\$| $1|" "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"; }
    step() { T srun -N 1 -n 2 --mesh-tp=2 "$HERE/dump_env.sh" 2>&1; }
    out=$(step)
    # Default: one list per node, the same on both ranks (NVIDIA/nccl#1478), each rank's own MESHRUN_NIC.
    [ "$(echo "$out" | grep -o 'NCCL_IB_HCA=[^ ]*' | grep -c '^NCCL_IB_HCA==mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11$')" = 2 ] ||
      fail "default: NCCL_IB_HCA is not the node's list on both ranks: $out"
    [ "$(echo "$out" | grep -o 'MESHRUN_NIC=[^ ]*' | sort -u | wc -l)" = 2 ] || fail "default: MESHRUN_NIC is not per rank: $out"
    with_args "nccl=off"
    out=$(step)
    echo "$out" | grep -q 'RANK=' || fail "nccl=off: step failed: $out"
    echo "$out" | grep -q 'NCCL_' && fail "nccl=off: NCCL variables set: $out"
    with_args "hca=rank"
    out=$(step)
    [ "$(echo "$out" | grep -o 'NCCL_IB_HCA=[^ ]*' | grep '^NCCL_IB_HCA==mlx5_[0-9]*$' | sort -u | wc -l)" = 2 ] ||
      fail "hca=rank: NCCL_IB_HCA is not each rank's own NIC: $out"
    grep -q 'hca_scope = rank.*NVIDIA/nccl#1478' "$LAB"/log/slurmd-n*.log ||
      fail "hca=rank: the plugin did not log NCCL's warning"
    # The site file is the one policy source (also meshrun exec's): its [site] and [env] reach the tasks;
    # a plugstack argument given explicitly overrides it.
    printf '[site]\nport_base = 20500\nhca_scope = "rank"\n[env]\nSITE_VAR = "from-site"\n' >"$WORK/site.toml"
    with_args "site=$WORK/site.toml"
    out=$(T srun -N 1 -n 2 --mesh-tp=2 sh -c 'echo "SITE $SITE_VAR $MASTER_PORT $NCCL_IB_HCA"' 2>&1)
    [ "$(echo "$out" | grep -c '^SITE from-site 2[0-9]* =mlx5_[0-9]*$')" = 2 ] || fail "site=: site policy missing: $out"
    port=$(echo "$out" | awk '/^SITE/ {print $3; exit}')
    [ "$port" -ge 20500 ] && [ "$port" -lt 32500 ] || fail "site=: MASTER_PORT $port outside the site's range"
    with_args "site=$WORK/site.toml hca=node"
    out=$(T srun -N 1 -n 2 --mesh-tp=2 printenv NCCL_IB_HCA 2>&1 | sort -u)
    [ "$out" = "=mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11" ] || fail "hca=node did not override the site file: $out"
    with_args "colour=blue"
    expect_refused "meshrun: plugstack.conf: bad argument 'colour=blue'" srun -N 1 true
    expect_refused "meshrun: plugstack.conf: bad argument 'colour=blue'" sbatch -N 1 --wrap true
    ;;

  optional_mode)
    # As an `optional` plugin, Slurm ignores init_post_opt/local_user_init/task_init failures. Option values are
    # still refused, and tasks must still never run with a wrong environment or during a dry run.
    conf=$LAB/etc/plugstack.conf
    cp "$conf" "$WORK/plugstack.good"
    trap 'cp "$WORK/plugstack.good" "$conf.tmp" && mv -f "$conf.tmp" "$conf"' EXIT
    sed 's/^required /optional /' "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"
    grep -q '^optional ' "$conf" || fail "could not switch the plugin to optional"
    expect_refused "mesh-tp='abc' is not a valid size" srun -N 1 --mesh-tp=abc true
    out=$(T srun -N 2 --ntasks-per-node=2 --mesh-tp=2 --mesh-dry-run touch "$WORK/ran" 2>&1)
    echo "$out" | grep -q '4 ranks on 2 nodes' || fail "no dry-run map: $out"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "optional mode: the dry run ran the command"
    out=$(T srun -N 2 -n 4 --distribution=cyclic --mesh-tp=2 echo TASK-RAN 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] || fail "optional mode: a wrong placement returned 0"
    echo "$out" | grep -q 'meshrun: ' || fail "optional mode: no message"
    echo "$out" | grep -q TASK-RAN && fail "optional mode: a task ran with a wrong environment"
    out=$(T srun -N 2 --ntasks-per-node=2 --mesh-tp=2 printenv MESHRUN_TP_SIZE | sort -u)
    [ "$out" = 2 ] || fail "optional mode: valid step got '$out'"
    say "optional plugin: bad options refused, dry run and bad placement run nothing, valid steps work"
    ;;

  no_ghost_steps)
    # A refused or dry-run srun inside an allocation must leave no step behind: Slurm kept such a step
    # RUNNING with its CPUs and the next srun waited ("Requested nodes are busy") until the time limit. The
    # reproducer of the issue, then a refusal, then steps whose shape only the created step knows (-w), each
    # followed by a plain step that must start at once. Memory-capped; the whole allocation under 60 s.
    start=$(date +%s)
    out=$( (vmem_cap 4000000; T salloc -N1 -n2 bash -c '
      srun --mesh-tp=2 --mesh-dry-run touch '"$WORK"'/ran; echo "dry rc=$?"
      timeout 15 srun -n2 true; echo "next1 rc=$?"
      srun --mesh-tp=3 touch '"$WORK"'/ran; echo "bad rc=$?"
      timeout 15 srun -n2 true; echo "next2 rc=$?"
      srun -w "$SLURM_JOB_NODELIST" --mesh-tp=2 --mesh-dry-run touch '"$WORK"'/ran; echo "late dry rc=$?"
      timeout 15 srun -n2 true; echo "next3 rc=$?"
      srun -w "$SLURM_JOB_NODELIST" --mesh-tp=3 touch '"$WORK"'/ran; echo "late bad rc=$?"
      timeout 15 srun -n2 true; echo "next4 rc=$?"
      echo "steps left: $(squeue -h -s -j $SLURM_JOB_ID | wc -l)"') 2>&1)
    took=$(( $(date +%s) - start ))
    echo "$out"
    echo "$out" | grep -q 'Requested nodes are busy' && fail "a later step waited for a ghost step"
    for n in 1 2 3 4; do echo "$out" | grep -q "^next$n rc=0" || fail "step after case $n did not run at once"; done
    echo "$out" | grep -q '^dry rc=[1-9]' || fail "the dry run returned 0 before the step existed"
    echo "$out" | grep -q '^bad rc=[1-9]' || fail "the refused step returned 0"
    echo "$out" | grep -q '^late bad rc=[1-9]' || fail "the late refusal returned 0"
    [ "$(echo "$out" | grep -c 'does not divide the job')" = 2 ] || fail "each refusal must print its line once"
    [ "$(echo "$out" | grep -c 'nothing launched')" = 2 ] || fail "each dry run must print its map once"
    # Inside the allocation the step's node is known: its real name (n1..n4), not a number alone.
    echo "$out" | grep -q -E '^  node 0 \(n[1-4]\): r0\[' || fail "inside an allocation the dry run must name the step's node"
    echo "$out" | grep -q '^steps left: 0' || fail "steps left behind in the allocation"
    [ "$took" -lt 30 ] || fail "the allocation took ${took}s: a step waited"
    sleep 1
    [ ! -e "$WORK/ran" ] || fail "a dry-run or refused step ran its command"
    say "no ghost steps: 8 steps in ${took}s, later steps started at once"
    ;;

  node_ranges)
    # -N MIN-MAX at sbatch: refused only when no count in the range fits, naming the range and what would.
    expect_refused 'no node count in -N 2-4 fits the layout' \
      sbatch -N 2-4 --ntasks-per-node=2 --mesh-tp=2 --mesh-dp=1 --wrap true
    out=$(T sbatch -N 2-4 --ntasks-per-node=2 --mesh-tp=2 --mesh-dp=1 --wrap true 2>&1)
    echo "$out" | grep -q 'node counts that would fit: 1' || fail "the refusal does not name the count that fits: $out"
    echo "$out" | grep -q '1 nodes × 2' && fail "a range was counted as one node: $out"
    # Only 4 nodes fit dp=4 (the idle cluster gives the range's top); the old check counted one node and refused.
    id=$(submit -N 2-4 --ntasks-per-node=2 --mesh-tp=2 --mesh-dp=4 --wrap 'srun printenv MESHRUN_DP_SIZE')
    [ "$(job_state "$id")" = COMPLETED ] || fail "job $id with a fitting count in -N 2-4: $(job_state "$id"); $(cat job-$id.out)"
    [ "$(grep -c '^4$' "job-$id.out")" = 8 ] || fail "job $id: expected 8 tasks with dp=4: $(cat job-$id.out)"
    id=$(submit --nodes=2-4 --ntasks-per-node=2 --mesh-tp=2 --mesh-dp=auto --wrap 'srun printenv MESHRUN_TP_SIZE')
    [ "$(job_state "$id")" = COMPLETED ] || fail "--nodes=2-4 with dp=auto refused or failed: $(cat job-$id.out)"
    say "node ranges: refused only when no count fits"
    ;;

  packaged_plugin)
    # The plugin from the Debian package (cpack -G DEB, unpacked with dpkg-deb -x here; the machine's Slurm
    # packages are untouched) loads in this cluster: its options are listed and a step gets its environment.
    command -v cpack >/dev/null && command -v dpkg-deb >/dev/null || { echo "SKIP: cpack or dpkg-deb missing"; exit 77; }
    [ -f "$MESHRUN_BUILD_DIR/CPackConfig.cmake" ] || fail "no CPackConfig.cmake in $MESHRUN_BUILD_DIR"
    LIMIT=240 T cpack --config "$MESHRUN_BUILD_DIR/CPackConfig.cmake" -G DEB -B "$WORK/deb" >cpack.log 2>&1 ||
      fail "cpack: $(tail -5 cpack.log)"
    deb=$(ls "$WORK"/deb/meshrun-slurm-plugin_*.deb) || fail "no plugin package"
    dpkg-deb -x "$deb" "$WORK/root" || fail "dpkg-deb -x $deb"
    so=$WORK/root/usr/lib/slurm/spank_meshrun.so
    [ -f "$so" ] || fail "no .so in $deb"
    conf=$LAB/etc/plugstack.conf
    cp "$conf" "$WORK/plugstack.good"
    trap 'cp "$WORK/plugstack.good" "$conf.tmp" && mv -f "$conf.tmp" "$conf"' EXIT
    sed -E "s#^(required|optional) [^ ]+#required $so#" "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"
    grep -q "^required $so" "$conf" || fail "plugstack.conf does not name the packaged plugin: $(cat "$conf")"
    T srun --help 2>&1 | grep -q -- '--mesh-tp' || fail "srun --help does not list --mesh-tp with the packaged plugin"
    out=$(T srun -N 2 --ntasks-per-node=2 --mesh-tp=2 printenv MESHRUN_TP_SIZE 2>&1 | sort | tr '\n' ' ')
    [ "$out" = "2 2 2 2 " ] || fail "step with the packaged plugin: '$out'"
    say "packaged plugin $(basename "$deb") loaded: 4 tasks with MESHRUN_TP_SIZE=2"
    ;;

  mpi_pmix)
    [ -x "${MPI_RANK_BIN:-}" ] || fail "MPI test program not built"
    # Multi-slurmd mode shares one host: Open MPI as `local-slurm env` configures it (see docs/plugin.md).
    eval "$("$SRC/scripts/local-slurm" env --dir "$LAB")"
    ok=0
    for attempt in 1 2; do  # Open MPI 4.1 on 2 cores flakes now and then; one retry
      out=$(T srun --mpi=pmix -N 2 --ntasks-per-node=2 --mesh-tp=2 "$MPI_RANK_BIN" 2>&1)
      echo "$out"
      n=$(echo "$out" | grep -c '^MPIRANK')
      good=$(echo "$out" | grep '^MPIRANK' | awk '{split($2,a,"="); split($4,b,"="); split($6,s,"="); split($7,e,"=");
             if (a[2] == b[2] && $5 == "WORLD_SIZE=4" && $3 == "mpi_size=4" && s[2] == e[2]) n++} END {print n+0}')
      if [ "$n" = 4 ] && [ "$good" = 4 ]; then ok=1; break; fi
      echo "attempt $attempt: $good/4 ranks agree"
    done
    [ $ok = 1 ] || fail "MPI ranks do not agree with the plugin's RANK"
    say "4 MPI ranks agree with RANK and the allreduce is right"
    ;;

  preflight_healthy)
    # A healthy allocation passes: every node's GEMM, link and binding rows PASS, GPUs and NICs (none here) are
    # skipped, never passed, and the whole run stays inside its functional bound (60 s). One retry: the four
    # nodes share this machine's two cores with whatever else runs on it, and one noisy probe is not a node fault.
    start=$(date +%s)
    for attempt in 1 2; do
      out=$(preflight_step 2>&1); rc=$?
      echo "$out"
      [ $rc = 0 ] && break
      echo "attempt $attempt: rc=$rc"
    done
    took=$(( $(date +%s) - start ))
    [ $rc = 0 ] || fail "a healthy allocation did not pass (rc=$rc)"
    echo "$out" | grep -q '^all 4 nodes passed$' || fail "no 'all 4 nodes passed' line"
    for n in n1 n2 n3 n4; do
      for c in cpus ranks binding gemm p2p; do
        preflight_row "$out" $n $c | grep -q ' PASS' || fail "$n $c did not pass: $(preflight_row "$out" $n $c)"
      done
      preflight_row "$out" $n gpus | grep -q 'skipped: no GPU on this node$' || fail "$n gpus is not 'skipped: no GPU on this node'"
      preflight_row "$out" $n nics | grep -q 'skipped: no NIC on this node$' || fail "$n nics is not 'skipped: no NIC on this node'"
    done
    echo "$out" | grep -Eq '^time: [0-9.]+ s' || fail "no time line"
    [ "$took" -le 60 ] || fail "preflight took ${took}s, more than the 60 s bound"
    say "4 nodes passed in ${took}s: $(echo "$out" | grep -E '^n[1-4] +gemm' | awk '{print $1, $3, "GFLOP/s"}' | paste -sd';')"
    ;;

  preflight_slow_node)
    # n3's slurmd (and so its step and tasks) limited to 8% of one CPU: a real slowdown. n3 fails, is the only
    # node named, in srun --exclude syntax, and the run ends with exit status 1; its neighbours' links pass.
    ulimit -c unlimited 2>/dev/null  # a crashing task leaves its core here (mpi_crashed)
    throttle "$(cat "$LAB/run/pids/slurmd-n3")" 8 || { echo "SKIP: no writable cpu cgroup (v2 cpu.max or v1 cpu.cfs_quota_us)"; exit 77; }
    for attempt in 1 2; do
      start=$(date +%s)
      out=$(preflight_step 2>&1); rc=$?
      took=$(( $(date +%s) - start ))
      echo "$out"
      [ $attempt = 1 ] && mpi_crashed "$out" && { echo "attempt 1: Open MPI crashed; one retry"; continue; }
      break
    done
    unthrottle
    [ $rc = 1 ] || fail "rc=$rc with n3 slowed (want 1)"
    echo "$out" | grep -q '^failing nodes: n3$' || fail "n3 is not the one failing node: $(echo "$out" | grep '^failing')"
    preflight_row "$out" n3 gemm | grep -q ' FAIL: ' || fail "n3's GEMM did not fail: $(preflight_row "$out" n3 gemm)"
    for n in n1 n2 n4; do
      preflight_row "$out" $n gemm | grep -q ' PASS' || fail "$n gemm: $(preflight_row "$out" $n gemm)"
      preflight_row "$out" $n p2p | grep -q ' PASS' || fail "$n p2p (a slow neighbour is not its fault): $(preflight_row "$out" $n p2p)"
    done
    [ "$took" -le 60 ] || fail "preflight took ${took}s with a slow node, more than the 60 s bound"
    say "n3 at 8% of a CPU: $(preflight_row "$out" n3 gemm | sed 's/  */ /g'); ${took}s"
    ;;

  preflight_stopped_node)
    # n3's tasks stopped for good (SIGSTOP) 1.5 s after they start: the run must not hang. Rank 0's watchdog
    # ends it after --timeout 10 with a line saying what it waited for and which ranks did not answer, and srun's
    # --kill-on-bad-exit ends the stopped tasks.
    [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
    # n3's tasks: meshrun-preflight processes whose environment says SLURMD_NODENAME=n3 (slurmstepd is not a
    # child of its slurmd: it is reparented to init).
    ( for _ in $(seq 300); do
        pids=$(for p in $(pgrep -f 'launcher/meshrun-preflight'); do
                 tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'SLURMD_NODENAME=n3' && echo "$p"
               done)
        if [ "$(echo "$pids" | grep -c .)" = 2 ]; then sleep 1.5; kill -STOP $pids && echo "$pids" >stopped; exit 0; fi
        sleep 0.05
      done ) &
    stopper=$!
    start=$(date +%s)
    out=$(LIMIT=60 SRUN_EXTRA=--kill-on-bad-exit=1 preflight_step --timeout 10 2>&1); rc=$?
    took=$(( $(date +%s) - start ))
    wait $stopper
    [ -f stopped ] && kill -CONT $(cat stopped) 2>/dev/null
    echo "$out"
    [ -f stopped ] || fail "n3's preflight tasks were never found and stopped"
    [ $rc != 0 ] && [ $rc != 124 ] || fail "rc=$rc with n3 stopped (124 = the run hung)"
    echo "$out" | grep -q '^meshrun preflight: rank 0 on n1: no result after 10 s, waiting for ' || fail "no watchdog line from rank 0"
    echo "$out" | grep -q '^all 4 nodes passed' && fail "a stopped node passed"
    [ "$took" -le 30 ] || fail "the run took ${took}s with a stopped node"
    # Rank 0 asks the ranks it waits for what they wait for: n3's ranks do not answer, a neighbour caught in an
    # exchange with n3 does (naming n3), so n3, and only n3, is named for srun --exclude.
    echo "$out" | grep -Eq 'no answer from rank\(s\) [0-9,-]+ on n3; ' || fail "the ranks named are not n3's alone"
    echo "$out" | grep -q '^failing nodes: n3$' || fail "no 'failing nodes: n3' line"
    say "stopped n3: ended after ${took}s: $(echo "$out" | grep -m1 'rank 0 on n1: no result')"
    ;;

  preflight_sbatch)
    # meshrun sbatch --preflight: the batch script runs meshrun preflight on the job's nodes before the job step;
    # healthy, the step runs after 'all 4 nodes passed'; with n3 slowed (8% of a CPU) the job stops there, naming
    # n3, and the step never runs.
    ulimit -c unlimited 2>/dev/null  # a crashing task leaves its core here (mpi_crashed)
    [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
    eval "$("$SRC/scripts/local-slurm" env --dir "$LAB")"
    submit_preflight() {
      local out
      out=$(T "$MESHRUN_BIN" sbatch --no-site "$SRC/templates/tiny.toml" --nodes 4 --gpus-per-node 2 --plugin no \
            --preflight --output "$WORK/job-%j.out" -- /bin/sh -c 'echo "STEP $SLURMD_NODENAME $RANK"' 2>&1) ||
        fail "meshrun sbatch --preflight: $out"
      id=$(echo "$out" | sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p')
      [ -n "$id" ] || fail "no job id: $out"
      wait_job "$id"
    }
    submit_preflight
    log=$(cat "job-$id.out")
    echo "$log"
    [ "$(job_state "$id")" = COMPLETED ] || fail "healthy job $id: $(job_state "$id")"
    echo "$log" | grep -q '^all 4 nodes passed$' || fail "no preflight verdict in the log"
    [ "$(echo "$log" | grep -c '^STEP n[1-4] [0-7]$')" = 8 ] || fail "the job step did not run its 8 ranks after the preflight"
    [ "$(echo "$log" | grep -n '^all 4 nodes passed$' | cut -d: -f1)" -lt "$(echo "$log" | grep -n '^STEP' | head -1 | cut -d: -f1)" ] ||
      fail "the job step ran before the preflight's verdict"
    throttle "$(cat "$LAB/run/pids/slurmd-n3")" 8 || { echo "SKIP: no writable cpu cgroup (v2 cpu.max or v1 cpu.cfs_quota_us)"; exit 77; }
    for attempt in 1 2; do
      submit_preflight
      log=$(cat "job-$id.out")
      echo "$log"
      [ $attempt = 1 ] && mpi_crashed "$log" && { echo "attempt 1: Open MPI crashed; one retry"; continue; }
      break
    done
    unthrottle
    [ "$(job_state "$id")" = FAILED ] || fail "job $id with n3 slowed: $(job_state "$id") (want FAILED)"
    echo "$log" | grep -q '^failing nodes: n3$' || fail "n3 not named in the log"
    echo "$log" | grep -q '^meshrun: preflight failed (exit 1); the job step was not started' || fail "no stop line"
    echo "$log" | grep -q '^STEP' && fail "the job step ran although a node failed"
    say "meshrun sbatch --preflight: healthy job ran its step; with n3 slowed job $id stopped before it, naming n3"
    ;;

  preflight_plugin)
    # sbatch --mesh-preflight: every srun of the job first runs a meshrun preflight step, started by the plugin
    # from srun before the step exists (never in slurmstepd), with the step's geometry and the plugin's own task
    # set-up; a failing node refuses the step. srun finds meshrun on its $PATH (or plugstack meshrun=PATH).
    ulimit -c unlimited 2>/dev/null  # a crashing task leaves its core here (mpi_crashed)
    [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
    eval "$("$SRC/scripts/local-slurm" env --dir "$LAB")"
    PATH=$(dirname "$MESHRUN_BIN"):$PATH
    expect_refused 'mesh-preflight runs a preflight step inside the job before this step, so it needs an allocation' \
      srun -N 1 -n 1 --mesh-preflight true
    # The lab's plugin describes every node with the DGX H100 export (topology_xml=), which this 2-CPU machine is
    # not, and preflight says so (every node's cpus row fails against it). Here the plugin reads the live node.
    conf=$LAB/etc/plugstack.conf
    cp "$conf" "$WORK/plugstack.good"
    restore() { unthrottle; cp "$WORK/plugstack.good" "$conf.tmp" && mv -f "$conf.tmp" "$conf"; }
    trap restore EXIT
    sed -E 's# topology_xml=[^ ]*##' "$WORK/plugstack.good" >"$conf.tmp" && mv -f "$conf.tmp" "$conf"
    grep -q topology_xml "$conf" && fail "plugstack.conf still names a topology: $(cat "$conf")"
    for attempt in 1 2; do  # Open MPI 4.1.4's TCP transport segfaults in MPI_Init now and then (issue 27): one retry
      id=$(submit -N 4 --ntasks-per-node=2 --mesh-tp=2 --mesh-preflight --wrap 'srun printenv MESHRUN_TP_SIZE')
      log=$(cat "job-$id.out"); echo "$log"
      [ $attempt = 1 ] && mpi_crashed "$log" && { echo "attempt 1: Open MPI crashed; one retry"; continue; }
      break
    done
    [ "$(job_state "$id")" = COMPLETED ] || fail "healthy job $id: $(job_state "$id")"
    echo "$log" | grep -q '^all 4 nodes passed$' || fail "no preflight verdict in the log of job $id"
    for n in n1 n2 n3 n4; do
      preflight_row "$log" $n binding | grep -q ' PASS' || fail "$n: the plugin's binding is not the map's: $(preflight_row "$log" $n binding)"
    done
    [ "$(echo "$log" | grep -c '^2$')" = 8 ] || fail "the step did not run its 8 tasks after the preflight"
    throttle "$(cat "$LAB/run/pids/slurmd-n3")" 8 || { echo "SKIP: no writable cpu cgroup (v2 cpu.max or v1 cpu.cfs_quota_us)"; exit 77; }
    trap restore EXIT
    for attempt in 1 2; do
      id=$(submit -N 4 --ntasks-per-node=2 --mesh-tp=2 --mesh-preflight --wrap 'srun printenv MESHRUN_TP_SIZE')
      log=$(cat "job-$id.out"); echo "$log"
      [ $attempt = 1 ] && mpi_crashed "$log" && { echo "attempt 1: Open MPI crashed; one retry"; continue; }
      break
    done
    unthrottle
    [ "$(job_state "$id")" = FAILED ] || fail "job $id with n3 slowed: $(job_state "$id") (want FAILED: its srun refused)"
    echo "$log" | grep -q '^failing nodes: n3$' || fail "n3 not named in the log"
    echo "$log" | grep -q 'meshrun: --mesh-preflight: the preflight step failed (exit 1' || fail "no refusal line"
    echo "$log" | grep -q '^2$' && fail "the step ran although a node failed"
    say "--mesh-preflight: healthy job ran its step after 'all 4 nodes passed'; with n3 slowed the step was refused"
    ;;

  preflight_bad_input)
    # Bad input: exit 2 and one line, outside a step and inside one (printed by rank 0 only).
    [ -x "${MESHRUN_BIN:-}" ] || { echo "SKIP: meshrun CLI not built"; exit 77; }
    eval "$("$SRC/scripts/local-slurm" env --dir "$LAB")"
    out=$(T "$MESHRUN_BIN" preflight --min-fraction 1.5 2>&1 >/dev/null); rc=$?
    [ $rc = 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] || fail "--min-fraction 1.5: rc=$rc, '$out'"
    out=$(T "$MESHRUN_BIN" preflight --no-site "$SRC/templates/tiny.toml" 2>&1); rc=$?
    [ $rc = 2 ] && [ "$(echo "$out" | wc -l)" = 1 ] && echo "$out" | grep -q 'not started as a job step' ||
      fail "outside a step: rc=$rc, '$out'"
    out=$(T srun --mpi=pmix -N 2 --ntasks-per-node=2 "$MESHRUN_BIN" preflight --no-site "$SRC/templates/tiny.toml" \
          --set parallel.dp=4 2>&1); rc=$?
    echo "$out"
    [ $rc = 2 ] || fail "a layout that does not fit the step: rc=$rc"
    [ "$(echo "$out" | grep -c '^meshrun preflight:')" = 1 ] || fail "not exactly one meshrun preflight line: $out"
    echo "$out" | grep -q 'the cluster has 4 GPUs' || fail "the line does not say why: $out"
    out=$(T srun --mpi=pmix -N 1 -n 1 "$MESHRUN_BIN" preflight "$WORK/missing.toml" 2>&1); rc=$?
    [ $rc = 2 ] && [ "$(echo "$out" | grep -c '^meshrun preflight:')" = 1 ] || fail "missing template: rc=$rc, $out"
    say "bad input: exit 2, one line each"
    ;;

  *) echo "unknown check $NAME" >&2; exit 2 ;;
esac
echo "PASS: $NAME"
