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

# The GPU machine has no TOML++, hwloc or Open MPI, glibc 2.34 and GCC 11's libstdc++ (docs/gpu.md): the check
# binary, which trains through meshrun-train's code, must need none of the three and no newer symbol version.
deps() { ldd "$1" | grep -E -o 'lib(tomlplusplus|hwloc|mpi|open-pal|open-rte|pmix)[^ ]*' | sort -u | tr '\n' ' '; }
[[ -z $(deps "$CHECK") ]] && pass "meshrun-gpu-check links no TOML++, hwloc or MPI library" \
  || bad "meshrun-gpu-check links $(deps "$CHECK")"
[[ -n $(deps "$TRAIN") ]] && pass "the same ldd check sees meshrun-train's MPI: $(deps "$TRAIN")" \
  || bad "the ldd check found no library in meshrun-train either: the check itself is broken"
newest() { objdump -T "$CHECK" | grep -o "$1[0-9.]*" | sed "s/$1//" | sort -uV | tail -1; }
glibc=$(newest GLIBC_) glibcxx=$(newest GLIBCXX_)
[[ $(printf '%s\n' "$glibc" 2.34 | sort -V | tail -1) == 2.34 ]] && pass "needs glibc $glibc (<= 2.34)" \
  || bad "meshrun-gpu-check needs glibc $glibc, the GPU machine has 2.34"
[[ $(printf '%s\n' "$glibcxx" 3.4.29 | sort -V | tail -1) == 3.4.29 ]] && pass "needs GLIBCXX_$glibcxx (<= 3.4.29)" \
  || bad "meshrun-gpu-check needs GLIBCXX_$glibcxx, the GPU machine has 3.4.29"

# meshrun-nccl-check (every NcclComm operation at world 1, run by check.sh on a GPU): the same limits, no MPI, and
# libnccl as a DT_NEEDED entry; without a GPU one line and exit 2.
if [[ $CUDA_BUILD == 1 ]]; then
  NCCL_CHECK=$(dirname "$CHECK")/meshrun-nccl-check
  [[ -z $(deps "$NCCL_CHECK") ]] && pass "meshrun-nccl-check links no TOML++, hwloc or MPI library" \
    || bad "meshrun-nccl-check links $(deps "$NCCL_CHECK")"
  readelf -d "$NCCL_CHECK" | grep -q "NEEDED.*libnccl.so" && pass "meshrun-nccl-check needs libnccl (DT_NEEDED)" \
    || bad "meshrun-nccl-check has no DT_NEEDED libnccl"
  CHECK=$NCCL_CHECK
  glibc=$(newest GLIBC_) glibcxx=$(newest GLIBCXX_)
  [[ $(printf '%s\n' "$glibc" 2.34 | sort -V | tail -1) == 2.34 && $(printf '%s\n' "$glibcxx" 3.4.29 | sort -V | tail -1) == 3.4.29 ]] \
    && pass "meshrun-nccl-check needs glibc $glibc and GLIBCXX_$glibcxx" || bad "meshrun-nccl-check needs glibc $glibc, GLIBCXX_$glibcxx"
  one_line "no GPU here: meshrun-nccl-check refuses" "$NCCL_CHECK"
  grep -q "no CUDA device" "$DIR/e" || bad "meshrun-nccl-check's refusal does not say 'no CUDA device'"
  one_line "meshrun-nccl-check: a bad argument" "$NCCL_CHECK" --elements 3
fi

# training.device: validated by the config, and "cuda" refused in one line (no device / no build here).
one_line "training.device = 'tpu' is a config error" "$TRAIN" "$TEMPLATE" --set training.device=tpu
grep -q "training.device" "$DIR/e" || bad "the error does not name training.device"
one_line "training.device = 'cuda' without a GPU" "$TRAIN" "$TEMPLATE" --set training.device=cuda --set parallel.tp=1 --set parallel.dp=1
if [[ $CUDA_BUILD == 1 ]]; then grep -q "no CUDA device\|driver\|0 devices" "$DIR/e" || bad "the refusal does not say there is no device"
else grep -q "no CUDA backend" "$DIR/e" || bad "the refusal does not say the build has no CUDA backend"; fi
exit $fail
