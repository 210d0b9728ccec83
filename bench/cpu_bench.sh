#!/bin/bash
# The CPU backend against references, side by side in one run (not a test; figures in docs/kernels.md):
#   1. the trainer's linear products vs OpenBLAS, one thread (build/bench/meshrun-bench-gemm);
#   2. a training step vs PyTorch (Debian's python3-torch, one thread) at the tiny and the mid size;
#   3. the tiny model on 2 ranks (DP 2, ZeRO-1) vs 1 rank.
# Every comparison is the median of interleaved pairs (ours, then the reference, PAIRS times) so that
# load from other processes hits both sides alike. A missing reference is skipped with a message.
# usage: bench/cpu_bench.sh [BUILD_DIR] [PAIRS]      (run from the repository root)
# References (benchmark only, not CI): apt-get install libopenblas-dev python3-torch, then re-run cmake.
set -eu
BUILD=${1:-build}
PAIRS=${2:-5}
TRAIN=$BUILD/trainer/meshrun-train
[ -x "$TRAIN" ] || { echo "cpu_bench: $TRAIN not found; build first (scripts/build)" >&2; exit 2; }
OUT=$(mktemp -d /tmp/meshrun-cpu-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores visible," \
  "flags: $(grep -m1 -o -w -E 'avx512f|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

echo "== 1. GEMM vs OpenBLAS (float32, one thread; GFLOP/s ours / OpenBLAS = median ratio of $PAIRS pairs)"
if [ -x "$BUILD/bench/meshrun-bench-gemm" ]; then
  OPENBLAS_NUM_THREADS=1 "$BUILD/bench/meshrun-bench-gemm" --pairs "$PAIRS"
else
  echo "skipped: $BUILD/bench/meshrun-bench-gemm was not built (cmake found no OpenBLAS);" \
    "apt-get install libopenblas-dev and re-run cmake"
fi

# Median ms per step of one meshrun-train run, over the steps after the first.
train_ms() {  # NAME ARGS...
  local name=$1; shift
  ${LAUNCH:-} "$TRAIN" "$@" --metrics "$OUT/$name.jsonl" >"$OUT/$name.log" 2>&1 ||
    { echo "cpu_bench: meshrun-train failed:" >&2; tail -5 "$OUT/$name.log" >&2; exit 1; }
  grep '"record":"step"' "$OUT/$name.jsonl" | tail -n +2 | sed 's/.*"ms_per_step":\([0-9.e+-]*\).*/\1/' | median
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f\n", a / b }'; }

ONE=(--set parallel.tp=1 --set parallel.dp=1 --set parallel.zero_stage=0)
TORCH=/usr/bin/python3
echo "== 2. training step vs PyTorch (one thread; ratio = PyTorch ms / meshrun ms, > 1: meshrun faster)"
if "$TORCH" -c 'import torch' 2>/dev/null; then
  echo "torch $("$TORCH" -c 'import torch; print(torch.__version__)'); its BLAS:" \
    "$(ldd "$("$TORCH" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))')" 2>/dev/null |
      grep -o -E 'lib(open)?blas[^ ]* => [^ ]*' | tr '\n' ' ')"
  echo "  (Debian links libtorch to libblas.so.3, which the alternatives system points at: $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3))"
  # NAME TOML STEPS, then the model as torch_step.py wants it: LAYERS HIDDEN FFN HEADS KV VOCAB SEQ BATCH MICRO
  step_pairs() {
    local name=$1 toml=$2 steps=$3; shift 3
    local ours ref ratios=() oms=() rms=()
    for ((p = 0; p < PAIRS; p++)); do
      ours=$(OMP_NUM_THREADS=1 train_ms "$name" "$toml" "${ONE[@]}" --set training.steps="$steps")
      ref=$(OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$TORCH" bench/torch_step.py "$@" "$steps")
      oms+=("$ours"); rms+=("$ref"); ratios+=("$(ratio "$ref" "$ours")")
    done
    printf '%-5s meshrun %8.1f ms/step, PyTorch %8.1f ms/step, ratio %s (pairs: %s)\n' "$name" \
      "$(printf '%s\n' "${oms[@]}" | median)" "$(printf '%s\n' "${rms[@]}" | median)" \
      "$(printf '%s\n' "${ratios[@]}" | median)" "${ratios[*]}"
  }
  step_pairs tiny templates/tiny.toml 6 4 128 352 4 2 256 64 16 4
  step_pairs mid bench/trainer-mid.toml 4 8 512 1408 8 4 256 256 4 4
else
  echo "skipped: Debian's python3-torch is not installed for /usr/bin/python3; apt-get install python3-torch"
fi

echo "== 3. tiny: 2 ranks (DP 2, ZeRO-1) vs 1 rank (ratio = 1-rank ms / 2-rank ms, > 1: 2 ranks faster)"
if command -v mpirun >/dev/null; then
  ratios=() one=() two=()
  for ((p = 0; p < PAIRS; p++)); do
    a=$(train_ms tiny1 templates/tiny.toml "${ONE[@]}" --set training.steps=11)
    b=$(LAUNCH="mpirun --oversubscribe --allow-run-as-root -np 2" train_ms tiny2 templates/tiny.toml \
      --set parallel.tp=1 --set parallel.dp=2 --set parallel.zero_stage=1 --set training.steps=11)
    one+=("$a"); two+=("$b"); ratios+=("$(ratio "$a" "$b")")
  done
  printf 'tiny  1 rank %7.1f ms/step, 2 ranks %7.1f ms/step, ratio %s (pairs: %s); 2-rank comm_exposed_ms (rank 0, median): %s\n' \
    "$(printf '%s\n' "${one[@]}" | median)" "$(printf '%s\n' "${two[@]}" | median)" \
    "$(printf '%s\n' "${ratios[@]}" | median)" "${ratios[*]}" \
    "$(grep '"record":"step"' "$OUT/tiny2.jsonl" | tail -n +2 | sed 's/.*"comm_exposed_ms":\([0-9.e+-]*\).*/\1/' | median)"
else
  echo "skipped: mpirun not found; apt-get install openmpi-bin"
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
