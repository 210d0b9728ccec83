#!/bin/bash
# The CUDA emulator's cost (docs/gpu.md, "The emulator"): a benchmark, not a test. Reports
#   1. meshrun-train on templates/tiny.toml (tp 1, world 1) with training.device = "cuda" in the EMULATED tree,
#      against the CPU backend's bf16 run of the same steps, side by side: median ms per step over steps 2..N
#      (step 1 includes the allocations) and the ratio;
#   2. the time the emulated stage adds to scripts/test: configuring and building build-emu (after build/, so
#      ccache serves every source outside the CUDA backend) and `ctest -L emulator -j nproc`.
# usage: bench/emulator_bench.sh [STEPS]   (default 6; run from a checkout where scripts/build has run)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-6}
[[ $steps =~ ^[0-9]+$ && $steps -ge 2 ]] || { echo "usage: bench/emulator_bench.sh [STEPS >= 2]" >&2; exit 2; }
[ -x build/trainer/meshrun-train ] || { echo "bench/emulator_bench.sh: run scripts/build first (build/ is the reference)" >&2; exit 2; }
dir=$(mktemp -d /tmp/meshrun-emu-bench-XXXXXX)
trap 'rm -rf "$dir"' EXIT

load=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$SECONDS
mkdir -p build-emu
cmake -S . -B build-emu -G Ninja -DMESHRUN_WERROR=ON -DMESHRUN_CUDA=EMULATED > "$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log" >&2; exit 1; }
cmake --build build-emu -j "$(nproc)" --target meshrun-emulator-tests > "$dir/build.log" 2>&1 || { tail -20 "$dir/build.log" >&2; exit 1; }
built=$SECONDS
(cd build-emu && ctest -L emulator -j "$(nproc)" > "$dir/ctest.log" 2>&1) || { tail -20 "$dir/ctest.log" >&2; exit 1; }
tested=$SECONDS

mkdir -p "$dir/text"
cp /usr/share/common-licenses/GPL-3 "$dir/text/"
common=(templates/tiny.toml --set data.text="$dir/text" --set data.text_cache="$dir/corpus.bin"
        --set training.steps="$steps" --set parallel.tp=1 --set parallel.ep=1)
build/trainer/meshrun-train "${common[@]}" --set training.dtype=bf16 --metrics "$dir/cpu.jsonl" > "$dir/cpu.log" 2>&1
build-emu/trainer/meshrun-train "${common[@]}" --set training.device=cuda --metrics "$dir/cuda.jsonl" > "$dir/cuda.log" 2>&1
python3 - "$dir/cpu.jsonl" "$dir/cuda.jsonl" "$steps" <<'PY'
import json, statistics, sys
def ms(p): return [r["ms_per_step"] for r in map(json.loads, open(p)) if r.get("record") == "step"][1:]
cpu, emu = statistics.median(ms(sys.argv[1])), statistics.median(ms(sys.argv[2]))
print(f"tiny.toml, tp 1, world 1, steps 2..{sys.argv[3]}: CPU bf16 {cpu:.0f} ms/step, emulated CUDA {emu:.0f} ms/step "
      f"(ratio {emu / cpu:.0f})")
PY
echo "emulated stage of scripts/test: configure + build $((built - t0)) s, ctest -L emulator $((tested - built)) s" \
     "(load average at the start: $load)"
