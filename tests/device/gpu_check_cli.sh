#!/bin/bash
# meshrun-gpu-check, bench/gpu/check.sh and training.device on this machine, which has no GPU: bad
# arguments and a missing device are one clear line and exit 2; the dry run needs no device.
# usage: gpu_check_cli.sh MESHRUN_GPU_CHECK CHECK_SH MESHRUN_TRAIN TEMPLATE CUDA_BUILD(0|1)
set -u
CHECK=$1 SCRIPT=$2 TRAIN=$3 TEMPLATE=$4 CUDA_BUILD=$5
DIR=$(mktemp -d /tmp/meshrun-gpu-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/../trainer/cli_lib.sh"
# one line on stderr, nothing on stdout
one_line() {
  local what=$1; shift
  "$@" >"$DIR/o" 2>"$DIR/e"
  local rc=$? lines
  lines=$(wc -l <"$DIR/e")
  if [[ $rc -eq 2 && $lines -eq 1 && ! -s "$DIR/o" ]]; then pass "$what: $(cat "$DIR/e")"
  else bad "$what: exit $rc, $lines stderr lines, stdout $(wc -c <"$DIR/o") bytes"; sed 's/^/     | /' "$DIR/e" | head -5; fi
}

one_line "unknown argument" "$CHECK" --frobnicate
one_line "steps out of range" "$CHECK" --perf-steps 0
one_line "bad --only" "$CHECK" --only everything
one_line "a sequence shorter than 2" "$CHECK" --perf-seq 1
expect 0 "usage: meshrun-gpu-check" "--help prints the usage" -- "$CHECK" --help
expect 0 "FLOP formula: 6\*N_matmul\*tokens" "dry run prints the plan without a device" -- "$CHECK" --dry-run
expect 0 "1.138B parameters" "dry run: the ~1B model" -- "$CHECK" --dry-run
if [[ $CUDA_BUILD == 1 ]]; then
  one_line "no GPU here: the binary refuses" "$CHECK"
  grep -q "no CUDA device" "$DIR/e" || bad "the refusal does not say 'no CUDA device'"
  expect 2 "no CUDA device" "no GPU here: check.sh refuses" -- "$SCRIPT"
else
  expect 2 "no CUDA backend" "a build without CUDA says so" -- "$CHECK"
fi
expect 2 "not found: build it with" "check.sh without the binary names the build command" -- \
  env MESHRUN_GPU_CHECK="$DIR/none" "$SCRIPT"

# training.device: validated by the config, and "cuda" refused in one line (no device / no build here).
one_line "training.device = 'tpu' is a config error" "$TRAIN" "$TEMPLATE" --set training.device=tpu
grep -q "training.device" "$DIR/e" || bad "the error does not name training.device"
one_line "training.device = 'cuda' without a GPU" "$TRAIN" "$TEMPLATE" --set training.device=cuda --set parallel.tp=1 --set parallel.dp=1
if [[ $CUDA_BUILD == 1 ]]; then grep -q "no CUDA device\|driver\|0 devices" "$DIR/e" || bad "the refusal does not say there is no device"
else grep -q "no CUDA backend" "$DIR/e" || bad "the refusal does not say the build has no CUDA backend"; fi
exit $fail
