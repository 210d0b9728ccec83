#!/bin/bash
# MESHRUN_CUDA = AUTO | ON | OFF | EMULATED at configure time, with the toolkit hidden (CUDACXX names no compiler):
# ON stops with the reason, AUTO builds without the backend and says what is missing, EMULATED needs no toolkit
# (the backend on device/emulator), a bad value stops.
# usage: cuda_option.sh SOURCE_DIR SCRATCH_DIR CMAKE
set -u
SRC=$1 SCRATCH=$2 CMAKE=$3
DIR=$(mktemp -d "$SCRATCH/cuda-option-XXXXXX")
trap 'rm -rf "$DIR"' EXIT
source "$SRC/tests/trainer/cli_lib.sh"
configure() { rm -rf "$DIR/b"; env CUDACXX=/nonexistent/nvcc "$CMAKE" -S "$SRC" -B "$DIR/b" -G Ninja "$@"; }
expect 1 "MESHRUN_CUDA=ON but nvcc" "ON without nvcc stops configure" -- configure -DMESHRUN_CUDA=ON
expect 0 "(MESHRUN_CUDA=AUTO): OFF, missing nvcc" "AUTO without nvcc configures the CPU-only tree" -- configure
expect 0 "(MESHRUN_CUDA=OFF): OFF" "OFF never looks" -- configure -DMESHRUN_CUDA=OFF
expect 0 "(MESHRUN_CUDA=EMULATED): on the host's CPU through device/emulator" "EMULATED configures without the toolkit" -- \
  configure -DMESHRUN_CUDA=EMULATED
expect 1 "MESHRUN_CUDA='maybe' is not AUTO, ON, OFF or EMULATED" "a bad value stops configure" -- configure -DMESHRUN_CUDA=maybe
exit $fail
