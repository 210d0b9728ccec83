#!/bin/bash
# Start-up soak on the local Slurm cluster (issue 27): many 2-node `meshrun sbatch templates/tiny.toml` jobs with
# training.steps=1, counting how many fail to start, under two Open MPI configurations side by side:
#   after   what `scripts/local-slurm env` prints today (the documented path: Open MPI's UCX PML)
#   before  the loopback TCP BTL the docs gave before (OMPI_MCA_btl=self,tcp ... ; Open MPI 4.1.4's TCP BTL
#           segfaulted in MPI_Init in 2 of 210 such jobs)
# Jobs of the two kinds are interleaved, so both see the same load. No job is retried: every failure counts. A
# submission that fails (meshrun sbatch exits non-zero) is counted as "unsubmitted", and the soak goes on. The
# summary is printed at the end, and on SIGINT/SIGTERM for the jobs so far (those still queued or running then
# count as "unfinished").
#
#   bench/startup_soak.sh [--jobs N] [--before N] [--build DIR] [--out DIR] [--nice N]
#     --jobs N     jobs with the documented configuration (default 600)
#     --before N   jobs with the old TCP configuration (default 200; 0 skips it)
#     --nice N     nice value of the soak cluster's slurmd daemons, inherited by every task (default 0), so a
#                  soak can share a machine with other work
# Needs root, Debian's slurm-wlm + munge + openmpi, and a build (spank_meshrun.so, meshrun, meshrun-train).
# Runs its own cluster (LOCAL_SLURM_DIR=/tmp/meshrun-soak, LOCAL_SLURM_PORT=7817), so it can run beside the tests.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
jobs=600 before=200 build=$here/build out=/tmp/meshrun-soak-out nice=0
while [ $# -gt 0 ]; do
  case $1 in
    --jobs) jobs=$2; shift 2 ;;
    --before) before=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --nice) nice=$2; shift 2 ;;
    *) echo "startup_soak: unknown argument '$1'; usage: $0 [--jobs N] [--before N] [--build DIR] [--out DIR] [--nice N]" >&2; exit 2 ;;
  esac
done
for n in "$jobs" "$before" "$nice"; do
  [[ $n =~ ^-?[0-9]+$ ]] || { echo "startup_soak: '$n' is not a whole number" >&2; exit 2; }
done
for f in plugin/spank_meshrun.so launcher/meshrun trainer/meshrun-train; do
  [ -e "$build/$f" ] || { echo "startup_soak: $build/$f is missing; build first (cmake --build $build)" >&2; exit 2; }
done

export LOCAL_SLURM_DIR=${LOCAL_SLURM_DIR:-/tmp/meshrun-soak} LOCAL_SLURM_PORT=${LOCAL_SLURM_PORT:-7817}
"$here/scripts/local-slurm" up --plugin "$build/plugin/spank_meshrun.so" >/dev/null || exit 1
trap '"$here/scripts/local-slurm" down >/dev/null 2>&1' EXIT
eval "$("$here/scripts/local-slurm" env)"
if [ "$nice" != 0 ]; then
  for p in "$LOCAL_SLURM_DIR"/run/pids/slurmd-*; do renice -n "$nice" -p "$(cat "$p")" >/dev/null; done
fi
rm -rf "$out" && mkdir -p "$out/bin"
# Private copies of the programs: a rebuild of $build during the soak must not fail its jobs.
cp "$build/launcher/meshrun" "$build/trainer/meshrun-train" "$out/bin/" || exit 1
export PATH=$out/bin:$PATH

# The documented environment, and the old one: the same variables with the TCP BTL instead.
after_env=$(env | grep -E '^(OMPI|UCX)_' | sort)
before_env=$(echo "$after_env" | grep -v -E '^OMPI_MCA_pml' ; echo "OMPI_MCA_btl=self,tcp"; echo "OMPI_MCA_btl_tcp_if_include=lo")
cd "$out" || exit 1

# Every submission is one line of $out/submissions: KIND and the job id, or KIND and "-" when it failed (its
# stderr then goes to $out/submit-failures).
submit() {  # KIND: submits one job with that kind's Open MPI environment
  local kind=$1 vars id
  if [ "$kind" = after ]; then vars=$after_env; else vars=$before_env; fi
  # shellcheck disable=SC2046
  if env -u OMPI_MCA_pml -u OMPI_MCA_pml_ucx_tls -u OMPI_MCA_pml_ucx_devices -u OMPI_MCA_btl $(echo "$vars") \
    meshrun sbatch "$here/templates/tiny.toml" --nodes 2 --gpus-per-node 2 --set training.steps=1 \
      --set job.name=soak-$kind --output "$out/$kind-%j.out" >"$out/submit.out" 2>"$out/submit.err" &&
    id=$(sed -n 's/^Submitted batch job \([0-9]*\)$/\1/p' "$out/submit.out") && [ -n "$id" ]; then
    echo "$kind $id" >>"$out/submissions"
  else
    echo "$kind -" >>"$out/submissions"
    { echo "submission $((i + 1)) ($kind):"; cat "$out/submit.err"; } >>"$out/submit-failures"
    echo "startup_soak: submission $((i + 1)) ($kind) failed: $(grep -m1 'error' "$out/submit.err" || tail -1 "$out/submit.err")" \
      "(all of it in $out/submit-failures); counted as unsubmitted, going on" >&2
  fi
}

# The table of every submission so far. Started: the job's log says training finished; crashed: a signal or
# segfault in the log; other: any other end (no log included); unfinished: still queued or running (an
# interrupted soak only). The crash rate is over the jobs that ended (started + crashed + other).
summary() {
  local queued kind id f n ok crash other unsub unfin bound
  queued=" $(squeue -h -o %i 2>/dev/null | tr '\n' ' ') "
  echo
  echo "startup soak: 2-node jobs (2 ranks per node) of templates/tiny.toml with training.steps=1, $(($(date +%s) - start)) s"
  printf '%-7s %6s %8s %8s %8s %11s %10s  %s\n' config jobs started crashed other unsubmitted unfinished "crash rate (95% upper bound)"
  rc=0
  for kind in after before; do
    n=0 ok=0 crash=0 other=0 unsub=0 unfin=0
    while read -r k id; do
      [ "$k" = "$kind" ] || continue
      f=$out/$kind-$id.out
      if [ "$id" = - ]; then unsub=$((unsub + 1))
      elif [[ $queued == *" $id "* ]]; then unfin=$((unfin + 1))
      elif grep -q '^meshrun-train: finished steps 1\.\.1' "$f" 2>/dev/null; then ok=$((ok + 1))
      elif grep -Eq 'Segmentation fault|Signal: |Bus error|core dumped' "$f" 2>/dev/null; then crash=$((crash + 1)); echo "  crashed: $f" >&2
      else other=$((other + 1)); echo "  failed: $f" >&2
      fi
    done < <(cat "$out/submissions" 2>/dev/null)
    [ $((ok + crash + other + unsub + unfin)) = 0 ] && continue
    n=$((ok + crash + other))
    # Zero events in n trials: the 95% upper bound is 3/n (rule of three); else the Wilson bound.
    bound=$(awk -v k=$crash -v n=$n 'BEGIN { z = 1.96; p = k / n;
      if (n == 0) { printf "no job ended"; exit }
      if (k == 0) { printf "%.2f%%", (n > 3 ? 300 / n : 100); exit }
      c = (p + z*z/(2*n) + z*sqrt(p*(1-p)/n + z*z/(4*n*n))) / (1 + z*z/n); printf "%.2f%%", 100 * c }')
    printf '%-7s %6d %8d %8d %8d %11d %10d  %.2f%% (%s)\n' $kind $n $ok $crash $other $unsub $unfin \
      "$(awk -v k=$crash -v n=$n 'BEGIN{print n ? 100*k/n : 0}')" "$bound"
    [ $kind = after ] && [ $((crash + other + unsub + unfin)) -gt 0 ] && rc=1
  done
  echo "logs: $out"
}

# Interleave: spread the `before` jobs evenly among the `after` ones. Keep 4 jobs in the queue (2 run at once on
# the 4 nodes): the queue never empties, and the scheduler is never flooded.
total=$((jobs + before)) sent_after=0 sent_before=0 start=$(date +%s)
trap 'echo "startup_soak: interrupted; the jobs so far:" >&2; summary; exit 130' INT TERM
for ((i = 0; i < total; i++)); do
  if [ $sent_before -lt "$before" ] && [ $((sent_before * total)) -le $((i * before)) ]; then
    kind=before; sent_before=$((sent_before + 1))
  else
    kind=after; sent_after=$((sent_after + 1))
  fi
  while [ "$(squeue -h | wc -l)" -ge 4 ]; do sleep 0.2; done
  submit $kind
  [ $((i % 50)) = 49 ] && echo "startup_soak: $((i + 1))/$total submitted ($(( $(date +%s) - start )) s)"
done
while [ "$(squeue -h | wc -l)" -gt 0 ]; do sleep 0.5; done
sleep 1
summary
exit $rc
