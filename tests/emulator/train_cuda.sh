#!/bin/bash
# meshrun-train with training.device = "cuda" at world 1, in the EMULATED build (docs/gpu.md): every layer on
# the CUDA backend (kernels.cu and the cuBLASLt calls of backend_cuda.cpp, executed by the emulator), against
# the CPU backend's training.dtype = "bf16" run (the same mixed precision) of the same template, step by step:
#   - losses within 5e-4 and grad norms within 5e-3 relative at every one of 8 steps, at lr 1e-3 (the
#     template's 3e-3 puts the tiny models on a loss spike at step 6, where any change of summation order is
#     amplified: the CPU backend alone, tp 1 against tp 2 in bf16, differs by 5% in grad norm at step 6 and 54%
#     at step 7, measured 2026-12-06; no two correct orders agree there). Measured here (2026-12-06, fused
#     attention): tiny within 1.6e-5 (loss) and 9.2e-4 (grad norm), tiny-moe 9.7e-5 and 1.4e-4;
#   - the validation loss (data.valid, training.eval_interval = 4) at steps 4 and 8 within 5e-4: evaluation runs
#     on the device too;
#   - a save at step 4 and a resume give the uninterrupted run's steps 5..8 bit for bit;
#   - the run header and the metrics' run record name the emulated device;
#   - training.recompute = full (tiny) and selective (tiny-moe) on the device: the same bits as none.
# More ranks (NCCL): train_nccl.sh.
# usage: train_cuda.sh tiny|moe MESHRUN_TRAIN TINY_TEMPLATE TINY_MOE_TEMPLATE MPIRUN (tiny: the dense template and
# the resume; moe: the MoE template; two ctest entries that can run side by side)
set -u
MODE=$1 TRAIN=$2 TINY=$3 MOE=$4 MPIRUN=$5
DIR=$(mktemp -d /tmp/meshrun-train-cuda-XXXXXX)
[[ -n ${KEEP:-} ]] || trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/../trainer/cli_lib.sh"

mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
# Validation data: the corpus's last 8 KiB as byte-level uint16 tokens (a raw token file).
python3 -c 'import sys; b = open(sys.argv[1], "rb").read()[-8192:]; open(sys.argv[2], "wb").write(b"".join(x.to_bytes(2, "little") for x in b))' \
  "$DIR/text/corpus.txt" "$DIR/valid.bin"
common=(--set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin" --set training.steps=8 --set parallel.tp=1
        --set parallel.ep=1 --set training.lr=1e-3 --set training.min_lr=1e-4 --set data.valid="$DIR/valid.bin"
        --set training.eval_interval=4)

# check.py CPU CUDA [SCALE_STEP]: the bounds above; SCALE_STEP multiplies that step's CUDA loss by 1.001 (the
# negative case: a tenth of a percent fails).
cat >"$DIR/check.py" <<'PY'
import json, sys
def steps(path): return [r for r in map(json.loads, open(path)) if r.get("record") == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
if len(sys.argv) > 3: b[int(sys.argv[3]) - 1]["loss"] *= 1.001
if len(a) != 8 or len(b) != 8: sys.exit(f"expected 8 steps, got {len(a)} and {len(b)}")
worst_l = max(abs(y["loss"] - x["loss"]) / x["loss"] for x, y in zip(a, b))
worst_g = max(abs(y["grad_norm"] - x["grad_norm"]) / x["grad_norm"] for x, y in zip(a, b))
evals = [(x.get("eval_loss"), y.get("eval_loss")) for x, y in zip(a, b) if x["step"] in (4, 8)]
if any(x is None or y is None for x, y in evals): sys.exit(f"no eval_loss at steps 4 and 8: {evals}")
worst_e = max(abs(y - x) / x for x, y in evals)
print(f"over 8 steps: loss within {worst_l:.2e}, grad norm within {worst_g:.2e}, eval loss (steps 4, 8) within {worst_e:.2e}")
sys.exit(0 if worst_l <= 5e-4 and worst_g <= 5e-3 and worst_e <= 5e-4 else 1)
PY

run_pair() {   # NAME TEMPLATE CUDA_EXTRA... (for the CUDA run only)
  local name=$1 template=$2; shift 2
  "$TRAIN" "$template" "${common[@]}" --set training.dtype=bf16 --metrics "$DIR/$name-cpu.jsonl" \
    >"$DIR/$name-cpu.log" 2>&1 || { bad "$name: the CPU bf16 run failed"; tail -5 "$DIR/$name-cpu.log"; }
  "$TRAIN" "$template" "${common[@]}" "$@" --set training.device=cuda --metrics "$DIR/$name-cuda.jsonl" \
    >"$DIR/$name-cuda.log" 2>&1 || { bad "$name: the CUDA run failed"; tail -5 "$DIR/$name-cuda.log"; }
  if out=$(python3 "$DIR/check.py" "$DIR/$name-cpu.jsonl" "$DIR/$name-cuda.jsonl"); then
    pass "$name: CUDA (emulated) against CPU bf16: $out"
  else bad "$name: CUDA (emulated) against CPU bf16: $out"; fi
  python3 "$DIR/check.py" "$DIR/$name-cpu.jsonl" "$DIR/$name-cuda.jsonl" 3 >/dev/null \
    && bad "$name: a 0.1% loss change at step 3 passed the check" || pass "$name: a 0.1% loss change at step 3 fails the check"
}

# same_run NAME REF.jsonl RUN.jsonl: every step's loss and grad_norm equal, bit for bit (recomputation).
same_run() {
  python3 - "$2" "$3" <<'PY' && pass "$1: bit for bit the run that keeps every activation" || bad "$1: differs from the run that keeps every activation"
import json, sys
def steps(p): return [(r["step"], r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if r.get("record") == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
sys.exit(0 if len(a) == 8 and a == b else 1)
PY
}

if [[ $MODE == moe ]]; then
  run_pair tiny-moe "$MOE"
  # Selective recomputation on the device: the norm and SwiGLU outputs (the experts' too) rebuilt in W.
  "$TRAIN" "$MOE" "${common[@]}" --set training.device=cuda --set training.recompute=selective \
    --metrics "$DIR/moe-selective.jsonl" >"$DIR/moe-selective.log" 2>&1 || { bad "tiny-moe selective: the CUDA run failed"; tail -5 "$DIR/moe-selective.log"; }
  same_run "tiny-moe CUDA recompute = selective" "$DIR/tiny-moe-cuda.jsonl" "$DIR/moe-selective.jsonl"
  [[ $fail -eq 0 ]] && echo "train_cuda moe: all passed" || echo "train_cuda moe: FAILED"
  exit $fail
fi

# tiny, with a save at step 4 in the CUDA run (the resume below starts there).
run_pair tiny "$TINY" --set checkpoint.dir="$DIR/ck" --set checkpoint.interval=4
grep -q "meshrun-train: device cuda:0 meshrun emulated CUDA device (host CPU) (bf16 weights/activations" \
  "$DIR/tiny-cuda.log" && pass "the header names the emulated device" || bad "the header does not name the emulated device"
python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1])][0]; sys.exit(0 if r["record"]=="run" and r["device"]=="cuda" and "emulated" in r["backend"] else 1)' \
  "$DIR/tiny-cuda.jsonl" && pass "the metrics' run record names device cuda and the emulated backend" \
  || bad "the metrics' run record does not name the emulated backend"

# Full recomputation on the device: each layer's forward run again before its backward.
"$TRAIN" "$TINY" "${common[@]}" --set training.device=cuda --set training.recompute=full \
  --metrics "$DIR/tiny-full.jsonl" >"$DIR/tiny-full.log" 2>&1 || { bad "tiny full: the CUDA run failed"; tail -5 "$DIR/tiny-full.log"; }
same_run "tiny CUDA recompute = full" "$DIR/tiny-cuda.jsonl" "$DIR/tiny-full.jsonl"

# Resume: the step-4 checkpoint of the CUDA run, as if the run had stopped there.
rm -rf "$DIR/ck/step-8"
echo step-4 >"$DIR/ck/latest"
expect 0 "resuming from $DIR/ck/step-4: step 4" "the CUDA run resumes from its step-4 checkpoint" -- \
  "$TRAIN" "$TINY" "${common[@]}" --set training.device=cuda --set checkpoint.dir="$DIR/ck" --metrics "$DIR/resumed.jsonl"
python3 - "$DIR/tiny-cuda.jsonl" "$DIR/resumed.jsonl" <<'PY' && pass "save at 4 + resume: steps 5..8 bit for bit" || bad "the resumed CUDA run differs from the uninterrupted one"
import json, sys
def steps(p): return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if r.get("record") == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
ok = sorted(b) == [5, 6, 7, 8] and all(a[s] == b[s] for s in b)
print({s: (a.get(s), b[s]) for s in b}) if not ok else None
sys.exit(0 if ok else 1)
PY

[[ $fail -eq 0 ]] && echo "train_cuda: all passed" || echo "train_cuda: FAILED"
exit $fail
