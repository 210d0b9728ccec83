#!/bin/bash
# The fuzz configuration on a machine with the CUDA toolkit (issue 27): configuring with -DMESHRUN_FUZZ=ON and
# -DMESHRUN_CUDA=ON must build the CUDA kernels' target. The sanitizer and libFuzzer flags are host-compiler
# flags: handed to nvcc they failed ("gcc: error: unrecognized argument to '-fsanitize=' option:
# 'fuzzer-no-link'", from nvcc's host compiler). Skipped (77) without clang-14 or nvcc.
# usage: fuzz_cuda_configure.sh SOURCE_DIR
set -u
src=$1
command -v clang++-14 >/dev/null || { echo "SKIP: no clang++-14"; exit 77; }
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || { echo "SKIP: no CUDA toolkit (nvcc)"; exit 77; }
dir=$(mktemp -d /tmp/meshrun-fuzz-cuda-XXXXXX)
trap 'rm -rf "$dir"' EXIT
if ! CC=clang-14 CXX=clang++-14 cmake -S "$src" -B "$dir" -G Ninja -DMESHRUN_FUZZ=ON -DMESHRUN_CUDA=ON \
     -DCMAKE_CUDA_COMPILER="$nvcc" -DBUILD_TESTING=OFF >"$dir/configure.log" 2>&1; then
  echo "FAIL: configure: $(tail -3 "$dir/configure.log")"; exit 1
fi
if ! ninja -C "$dir" meshrun_cuda_kernels >"$dir/build.log" 2>&1; then
  echo "FAIL: the CUDA kernels do not build in the fuzz configuration: $(grep -m2 -i 'error' "$dir/build.log")"; exit 1
fi
grep -q -- "-fsanitize" <(ninja -C "$dir" -t commands meshrun_cuda_kernels | grep "\.cu") &&
  { echo "FAIL: nvcc is handed -fsanitize flags"; exit 1; }
ninja -C "$dir" -t commands meshrun_mesh_core | grep -q -- "-fsanitize=fuzzer-no-link" ||
  { echo "FAIL: the host libraries lost their libFuzzer coverage flag"; exit 1; }
echo "ok   fuzz + CUDA configuration: the CUDA kernels build without host-only flags, host code keeps -fsanitize=fuzzer-no-link"
