#!/bin/bash
# The one-command device check of docs/gpu.md, for a machine with one NVIDIA GPU (H200: under 5 minutes).
#   bench/gpu/check.sh [meshrun-gpu-check arguments]
# Runs build/device/meshrun-gpu-check (built on a build machine with -DMESHRUN_CUDA=ON and carried along;
# override with MESHRUN_GPU_CHECK=path). cuBLASLt is taken from the system if the loader finds it, else
# from the pip wheel nvidia-cublas (put on LD_LIBRARY_PATH). The output is also written to
# $OUT/gpu-check.log when OUT is set. Then build/device/meshrun-nccl-check (every NcclComm operation at world 1
# on the machine's libnccl, from the system or the pip wheel nvidia-nccl; MESHRUN_NCCL_CHECK=path overrides; it is
# skipped with a line saying why when absent or when libnccl is not found). Then bench/gpu/train_check.sh:
# meshrun-train itself with training.device = "cuda" (tiny against the CPU backend, the ~1B model's tokens/s
# and MFU, PyTorch's step on the same GPU); MESHRUN_TRAIN=path overrides build/trainer/meshrun-train.
# On a GPU machine without Debian's libraries, carry the directory bench/gpu/bundle.sh writes (.gpu-bundle:
# the three binaries and the libraries they load) and run with MESHRUN_BUNDLE=.gpu-bundle; check.sh also uses
# .gpu-bundle by itself when it is there. Exit status: the parts' worst (0 all passed, 1 a check failed), 2 when
# something meshrun-gpu-check needs is missing (named on stderr).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bundle="${MESHRUN_BUNDLE:-$root/.gpu-bundle}"
if [ -f "$bundle/env.sh" ]; then
  source "$bundle/env.sh"
  echo "bundle: $bundle"
elif [ -n "${MESHRUN_BUNDLE:-}" ]; then
  echo "bench/gpu/check.sh: MESHRUN_BUNDLE=$MESHRUN_BUNDLE has no env.sh: write it with bench/gpu/bundle.sh" >&2; exit 2
fi
bin="${MESHRUN_GPU_CHECK:-$root/build/device/meshrun-gpu-check}"
die() { echo "bench/gpu/check.sh: $*" >&2; exit 2; }

[ -x "$bin" ] || die "$bin not found: build it with 'cmake -S . -B build -G Ninja -DMESHRUN_CUDA=ON && ninja -C build meshrun-gpu-check' on a machine with the CUDA toolkit, and bring build/device/meshrun-gpu-check along (or set MESHRUN_GPU_CHECK)"

# cuBLASLt (and libnccl, for meshrun-nccl-check) from pip wheels when the loader does not already find them.
nccl_bin="${MESHRUN_NCCL_CHECK:-$root/build/device/meshrun-nccl-check}"
train_bin="${MESHRUN_TRAIN:-$root/build/trainer/meshrun-train}"
if ldd "$bin" 2>/dev/null | grep -q 'libcublasLt.*not found' || { [ -x "$nccl_bin" ] && ldd "$nccl_bin" 2>/dev/null | grep -q 'libnccl.*not found'; } ||
   { [ -x "$train_bin" ] && ldd "$train_bin" 2>/dev/null | grep -q -E '(libcublasLt|libnccl).*not found'; }; then
  dirs=""
  if command -v python3 >/dev/null; then
    dirs=$(python3 - <<'PY' 2>/dev/null
import importlib.util, os
for mod in ("nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime", "nvidia.nccl"):
    try:
        spec = importlib.util.find_spec(mod)
    except Exception:
        continue
    for p in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("lib", "lib64"):
            if os.path.isdir(os.path.join(p, sub)):
                print(os.path.join(p, sub))
PY
)
  fi
  # also a plain glob over the usual site-packages locations
  for d in /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/dist-packages/nvidia/*/lib \
           /usr/local/lib/python3*/site-packages/nvidia/*/lib "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && dirs="$dirs"$'\n'"$d"
  done
  for d in $dirs; do
    ls "$d"/libcublasLt.so* "$d"/libnccl.so* >/dev/null 2>&1 && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
fi
missing=$(ldd "$bin" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
[ -z "$missing" ] || die "$bin needs ${missing% } which the loader cannot find: install the wheel (pip install nvidia-cublas) or add its lib/ directory to LD_LIBRARY_PATH"
# the binary was built on Debian 12: glibc >= 2.34 and libstdc++ >= GCC 11 must be here
if ! err=$("$bin" --dry-run 2>&1 >/dev/null); then die "$bin does not start here: ${err%%$'\n'*}"; fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "binary: $bin"
echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
log=/dev/null
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; log="$OUT/gpu-check.log"; fi
# Caps that keep the whole check within about 5 minutes: 100 + 20 + train_check's (3 x 20 tiny, 80 perf,
# 40 torch) = 300 s when every part runs into its cap (a few minutes expected, not measured).
timeout 100 "$bin" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 124 ] && echo "bench/gpu/check.sh: meshrun-gpu-check stopped after 100 s" | tee -a "$log" >&2
# NCCL at world 1 (a one-rank communicator, send/receive to itself): what one GPU can say of NcclComm.
if [ ! -x "$nccl_bin" ]; then
  echo "nccl: not checked: $nccl_bin not found (ninja -C build meshrun-nccl-check on the build machine, and bring it along)" | tee -a "$log"
elif missing=$(ldd "$nccl_bin" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' '); [ -n "$missing" ]; then
  echo "nccl: not checked: $nccl_bin needs ${missing% } which the loader cannot find (pip install nvidia-nccl-cu13, or add its lib/ to LD_LIBRARY_PATH)" | tee -a "$log"
else
  timeout 20 "$nccl_bin" 2>&1 | tee -a "$log"
  nrc=${PIPESTATUS[0]}
  [ "$nrc" -eq 124 ] && echo "bench/gpu/check.sh: meshrun-nccl-check stopped after 20 s" | tee -a "$log" >&2
  [ "$nrc" -gt "$rc" ] && rc=$nrc
fi
# meshrun-train itself on the device (train_check.sh); one line saying why when it cannot start here.
if [ ! -x "$train_bin" ]; then
  echo "train: not checked: $train_bin not found (ninja -C build meshrun-train on the build machine, or bench/gpu/bundle.sh)" | tee -a "$log"
elif missing=$(ldd "$train_bin" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' '); [ -n "$missing" ]; then
  echo "train: not checked: $train_bin needs ${missing% } which the loader cannot find (bench/gpu/bundle.sh packs them)" | tee -a "$log"
elif ! err=$("$train_bin" --version 2>&1 >/dev/null); then
  echo "train: not checked: $train_bin does not start here: ${err%%$'\n'*}" | tee -a "$log"
else
  MESHRUN_TRAIN="$train_bin" "$root/bench/gpu/train_check.sh" 2>&1 | tee -a "$log"
  trc=${PIPESTATUS[0]}
  [ "$trc" -gt "$rc" ] && rc=$trc
fi
exit "$rc"
