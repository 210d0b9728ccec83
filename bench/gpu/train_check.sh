#!/bin/bash
# meshrun-train itself with training.device = "cuda" at world 1: the part of bench/gpu/check.sh that runs the
# program users run (docs/gpu.md "The device check"). Two parts:
#   tiny  templates/tiny.toml at tp 1, 8 steps on the device against the CPU backend's training.dtype = bf16 run
#         (losses within 1e-2 and grad norms within 2e-2 relative at every step, the GPU-trainer issue's
#         bounds: cuBLASLt sums in its own order), then a save at step 4 and a resume that must give steps 5..8
#         bit for bit;
#   perf  bench/gpu/train-1b.toml (the ~1B model of meshrun-gpu-check's perf part): median step time over the
#         steps after 3 warm-up ones, tokens/s, MFU against the data sheet's peak (meshrun-train's own figure),
#         the CUDA-event time per kernel kind; then bench/torch_step.py builds the same model and step in PyTorch
#         on the same GPU (bf16 autocast, SDPA flash attention, fused AdamW) and the ratio of the two step times.
# usage: bench/gpu/train_check.sh [--only tiny|perf] [--perf-template T] [--perf-steps N]
# MESHRUN_TRAIN (default build/trainer/meshrun-train, or the bundle's: bench/gpu/bundle.sh) and TORCH_PYTHON
# (default python3; the comparison is skipped with a line when it has no torch with CUDA). Each run is capped
# (20 s per tiny run, 80 s the perf run, 40 s PyTorch's: a GPU's budget); TRAIN_CHECK_TIME_SCALE multiplies the
# caps (the emulator's test sets 10: emulated kernels are about 30x slower). Exit 0 all passed,
# 1 a check failed, 2 bad arguments or no meshrun-train.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
TRAIN="${MESHRUN_TRAIN:-$root/build/trainer/meshrun-train}"
TORCH_PYTHON="${TORCH_PYTHON:-python3}"
SCALE="${TRAIN_CHECK_TIME_SCALE:-1}"
[[ $SCALE =~ ^[1-9][0-9]*$ ]] || { echo "train_check.sh: TRAIN_CHECK_TIME_SCALE must be a positive integer" >&2; exit 2; }
only="" perf_template="$root/bench/gpu/train-1b.toml" perf_steps=10 warmup=3
while [ $# -gt 0 ]; do
  case "$1" in
    --only) [[ ${2:-} == tiny || ${2:-} == perf ]] || { echo "train_check.sh: --only needs tiny or perf" >&2; exit 2; }
            only=$2; shift 2 ;;
    --perf-template) [ -f "${2:-}" ] || { echo "train_check.sh: --perf-template needs a template file" >&2; exit 2; }
                     perf_template=$2; shift 2 ;;
    --perf-steps) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "train_check.sh: --perf-steps needs a positive count" >&2; exit 2; }
                  perf_steps=$2; shift 2 ;;
    *) echo "train_check.sh: unknown argument '$1' (usage: train_check.sh [--only tiny|perf] [--perf-template T] [--perf-steps N])" >&2; exit 2 ;;
  esac
done
[ -x "$TRAIN" ] || { echo "train_check.sh: $TRAIN not found (build meshrun-train, or set MESHRUN_TRAIN)" >&2; exit 2; }

DIR=$(mktemp -d /tmp/meshrun-train-check-XXXXXX)
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$DIR"' EXIT
source "$root/tests/trainer/cli_lib.sh"
mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
data=(--set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin")

# run NAME SECONDS ARGS...: meshrun-train with its log in DIR/NAME.log and metrics in DIR/NAME.jsonl.
run() {
  local name=$1 limit=$(($2 * SCALE)); shift 2
  timeout "$limit" "$TRAIN" "$@" --metrics "$DIR/$name.jsonl" >"$DIR/$name.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    [[ $rc -eq 124 ]] && bad "$name: stopped after $limit s" || bad "$name: meshrun-train exited $rc"
    sed 's/^/     | /' "$DIR/$name.log" | tail -6
    return 1
  fi
}

if [[ -z $only || $only == tiny ]]; then
  echo "== meshrun-train, tiny: CUDA against the CPU backend's bf16, 8 steps"
  tiny=("$root/templates/tiny.toml" "${data[@]}" --set parallel.tp=1 --set parallel.dp=1 --set training.steps=8
        --set training.lr=1e-3 --set training.min_lr=1e-4)
  if run tiny-cpu 20 "${tiny[@]}" --set training.dtype=bf16 &&
     run tiny-cuda 20 "${tiny[@]}" --set training.device=cuda --set checkpoint.dir="$DIR/ck" --set checkpoint.interval=4; then
    grep -m1 "^meshrun-train: device " "$DIR/tiny-cuda.log" | sed 's/^/  /'
    python3 - "$DIR/tiny-cpu.jsonl" "$DIR/tiny-cuda.jsonl" <<'PY' && pass "tiny: every step within the bounds" || bad "tiny: a step outside the bounds"
import json, sys
def steps(p): return [r for r in map(json.loads, open(p)) if r.get("record") == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
ok = len(a) == len(b) == 8
for x, y in zip(a, b):
    rl = abs(y["loss"] - x["loss"]) / x["loss"]
    rg = abs(y["grad_norm"] - x["grad_norm"]) / x["grad_norm"]
    good = rl <= 1e-2 and rg <= 2e-2
    ok = ok and good
    print(f"  step {x['step']}  loss cuda {y['loss']:.6f} cpu-bf16 {x['loss']:.6f} rel {rl:.2e}  "
          f"grad_norm rel {rg:.2e}  {'PASS' if good else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
    rm -rf "$DIR/ck/step-8"
    echo step-4 >"$DIR/ck/latest"
    if run tiny-resume 20 "${tiny[@]}" --set training.device=cuda --set checkpoint.dir="$DIR/ck"; then
      python3 - "$DIR/tiny-cuda.jsonl" "$DIR/tiny-resume.jsonl" <<'PY' && pass "tiny: save at 4 + resume gives steps 5..8 bit for bit" || bad "tiny: the resumed run differs from the uninterrupted one"
import json, sys
def steps(p): return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if r.get("record") == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
sys.exit(0 if sorted(b) == [5, 6, 7, 8] and all(a[s] == b[s] for s in b) else 1)
PY
    fi
  fi
fi

if [[ -z $only || $only == perf ]]; then
  total=$((warmup + perf_steps))
  echo "== meshrun-train, perf: $(basename "$perf_template"), $warmup warm-up + $perf_steps timed steps on the device"
  if run perf 80 "$perf_template" "${data[@]}" --set training.device=cuda --set training.steps="$total"; then
    grep -E "^meshrun-train: (device|MFU|memory)" "$DIR/perf.log" | sed 's/^/  /'
    perf=$(python3 - "$DIR/perf.jsonl" "$warmup" <<'PY'
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("record") == "step"][int(sys.argv[2]):]
run = next(r for r in map(json.loads, open(sys.argv[1])) if r.get("record") == "run")
ms = statistics.median(r["ms_per_step"] for r in rows)
mfu = [r["mfu"] for r in rows]
tok = statistics.median(r["tokens_per_s"] for r in rows)
mfu_text = "n/a (" + run["peak_source"] + ")" if any(m is None for m in mfu) else f"{100 * statistics.median(mfu):.1f}%"
print(f"  median over {len(rows)} steps: {ms:.1f} ms/step, {tok:.0f} tokens/s, MFU {mfu_text}")
kinds = {}
for r in rows:
    for k, v in r.get("kernel_ms", {}).items():
        kinds[k] = kinds.get(k, 0.0) + v
wall = sum(r["ms_per_step"] for r in rows)
if kinds:
    print("  CUDA-event time per kernel kind over those steps (ms, share of wall time):")
    for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"    {k:<24} {v:10.1f}  {100 * v / wall:5.1f}%")
print(f"MS {ms}")
PY
)
    echo "$perf" | grep -v '^MS '
    meshrun_ms=$(echo "$perf" | sed -n 's/^MS //p')
    [ -n "$meshrun_ms" ] && pass "perf: meshrun-train ran $total steps on the device" || bad "perf: no step times in the metrics"
    # The same model and step in PyTorch, read from the template (bench/torch_step.py's arguments).
    model=$(python3 - "$perf_template" <<'PY'
import sys, tomllib
t = tomllib.load(open(sys.argv[1], "rb"))
m, tr = t["model"], t["training"]
print(m["layers"], m["hidden"], m["ffn_hidden"], m["heads"], m["kv_heads"], m["vocab"], tr["seq_len"],
      tr["global_batch_size"], tr["micro_batch_size"])
PY
)
    if ! "$TORCH_PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      echo "  torch: not compared: $TORCH_PYTHON has no torch with a CUDA device"
    elif [ -n "$meshrun_ms" ] && torch_ms=$(timeout $((40 * SCALE)) "$TORCH_PYTHON" "$root/bench/torch_step.py" $model $((perf_steps + 1)) cuda 2>"$DIR/torch.err"); then
      python3 -c 'import sys; m, t = float(sys.argv[1]), float(sys.argv[2]); print(f"  PyTorch on the same GPU: {t:.1f} ms/step; meshrun-train / PyTorch = {m / t:.2f}")' "$meshrun_ms" "$torch_ms"
    else
      echo "  torch: the PyTorch step failed or ran past $((40 * SCALE)) s: $(tail -1 "$DIR/torch.err")"
    fi
  fi
fi

[[ $fail -eq 0 ]] && echo "train_check: all passed" || echo "train_check: a check FAILED"
exit $fail
