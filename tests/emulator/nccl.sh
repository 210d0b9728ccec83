#!/usr/bin/env bash
# NcclComm over the fake NCCL on 4 ranks (test_nccl.cpp "ops"), then each NCCL rule the fake keeps: every case
# must end the job with the fake's one line (or the returned error) naming the communicator, the rank and the calls.
# usage: nccl.sh TEST_NCCL MPIRUN
set -u
BIN=$1
MPIRUN=$2
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() {  # run NAME TIMEOUT_S [env...] -- mode: the job's output lands in $out, its exit code in $rc
  local mode=$1 limit=$2
  shift 2
  timeout "$limit" env "$@" "$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1 -np 4 "$BIN" "$mode" >"$out" 2>&1
  rc=$?
}
expect() {  # expect NAME RC_KIND PATTERN: RC_KIND ok|fail
  local name=$1 kind=$2 pattern=$3
  if [ "$kind" = ok ] && [ "$rc" -ne 0 ]; then echo "FAIL $name: exit $rc"; cat "$out"; fail=1; return; fi
  if [ "$kind" = fail ] && { [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; }; then echo "FAIL $name: exit $rc (want a refusal)"; cat "$out"; fail=1; return; fi
  if ! grep -qE "$pattern" "$out"; then echo "FAIL $name: no line matching: $pattern"; cat "$out"; fail=1; return; fi
  echo "ok $name: $(grep -m1 -E "$pattern" "$out")"
}

run ops 240
expect ops ok "nccl ops: ok \(4 ranks"

t0=$(date +%s)
run reorder 60 MESHRUN_FAKE_NCCL_TIMEOUT_S=20
expect reorder fail "communicator 'world' \(4 ranks\), call #[0-9]+: rank 0 launched ncclAllReduce\(count 256, fp32, sum\) but rank 1 launched ncclAllGather\(sendcount 256, fp32\)"
run count 60 MESHRUN_FAKE_NCCL_TIMEOUT_S=20
expect count fail "rank 0 launched ncclAllReduce\(count 256, fp32, sum\) but rank 1 launched ncclAllReduce\(count 128, fp32, sum\)"
run split 60 MESHRUN_FAKE_NCCL_TIMEOUT_S=20
expect split fail "rank 0 launched ncclCommSplit but rank 1 launched ncclAllReduce"
run unmatched 60 MESHRUN_FAKE_NCCL_TIMEOUT_S=3
expect unmatched fail "rank 0: ncclSend of 256 fp32 to rank 1 on communicator 'world' \(4 ranks\) was not matched within 3 s: NCCL has no eager buffering"
run destroyed 60
expect destroyed fail "ncclAllReduce on communicator 'world' \(4 ranks\) after ncclCommDestroy"
run host_memory 60
expect host_memory ok "ncclAllReduce on host memory: invalid argument.*sendbuff is not 1024 bytes of device memory"
grep -q "NcclComm refused: NcclComm::all_gather on group world: one buffer in device memory, the other on the host" "$out" ||
  { echo "FAIL host_memory: NcclComm took a mixed pair"; cat "$out"; fail=1; }
run abort 60 MESHRUN_FAKE_NCCL_TIMEOUT_S=30
expect abort ok "rank 0: aborted after [0-9.]+ s: NCCL all_reduce on group world failed: remote process exited"
echo "rule cases: $(( $(date +%s) - t0 )) s"
exit $fail
