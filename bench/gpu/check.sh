#!/bin/bash
# The one-command device check of docs/gpu.md, for a machine with one NVIDIA GPU (H200: under 5 minutes).
#   bench/gpu/check.sh [meshrun-gpu-check arguments]
# Runs build/device/meshrun-gpu-check (built on a build machine with -DMESHRUN_CUDA=ON and carried along;
# override with MESHRUN_GPU_CHECK=path). cuBLASLt is taken from the system if the loader finds it, else
# from the pip wheel nvidia-cublas (put on LD_LIBRARY_PATH). The output is also written to
# $OUT/gpu-check.log when OUT is set. Exit status: the binary's (0 all passed, 1 a check failed),
# 2 when something it needs is missing (named on stderr).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${MESHRUN_GPU_CHECK:-$root/build/device/meshrun-gpu-check}"
die() { echo "bench/gpu/check.sh: $*" >&2; exit 2; }

[ -x "$bin" ] || die "$bin not found: build it with 'cmake -S . -B build -G Ninja -DMESHRUN_CUDA=ON && ninja -C build meshrun-gpu-check' on a machine with the CUDA toolkit, and bring build/device/meshrun-gpu-check along (or set MESHRUN_GPU_CHECK)"

# cuBLASLt from a pip wheel when the loader does not already find it.
if ldd "$bin" 2>/dev/null | grep -q 'libcublasLt.*not found'; then
  dirs=""
  if command -v python3 >/dev/null; then
    dirs=$(python3 - <<'PY' 2>/dev/null
import importlib.util, os
for mod in ("nvidia.cublas", "nvidia.cu13", "nvidia.cuda_runtime"):
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
    ls "$d"/libcublasLt.so* >/dev/null 2>&1 && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
fi
missing=$(ldd "$bin" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
[ -z "$missing" ] || die "$bin needs ${missing% } which the loader cannot find: install the wheel (pip install nvidia-cublas) or add its lib/ directory to LD_LIBRARY_PATH"
# the binary was built on Debian 12: glibc >= 2.34 and libstdc++ >= GCC 11 must be here
if ! err=$("$bin" --dry-run 2>&1 >/dev/null); then die "$bin does not start here: ${err%%$'\n'*}"; fi

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
echo "binary: $bin"
echo "LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  timeout 290 "$bin" "$@" 2>&1 | tee "$OUT/gpu-check.log"
  rc=${PIPESTATUS[0]}
else
  timeout 290 "$bin" "$@"
  rc=$?
fi
[ "$rc" -eq 124 ] && echo "bench/gpu/check.sh: stopped after 290 s (the 5-minute budget)" >&2
exit "$rc"
