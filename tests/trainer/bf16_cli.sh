#!/bin/bash
# training.dtype = "bf16" on the CPU backend (the CUDA backend's mixed precision: bf16 weights and
# activations, fp32 gradients, master weights and Adam moments): templates/tiny.toml (tp2 x dp2, ZeRO-1)
# for its 60 steps next to the fp32 run of the same setup. The header must say bf16, the loss must stay
# within 5e-2 relative of fp32's at every step and fall. The corpus is generated, as in golden_loss.sh.
# usage: bf16_cli.sh MESHRUN_TRAIN TEMPLATE MPIRUN
set -u
TRAIN=$1 TEMPLATE=$2 MPIRUN=$3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-bf16-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"

mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
common=(--set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin")
for dt in fp32 bf16; do
  if ! "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" "${common[@]}" --set training.dtype=$dt --metrics "$DIR/$dt.jsonl" \
      >"$DIR/$dt.log" 2>&1; then
    bad "$dt run failed"; tail -5 "$DIR/$dt.log" | sed 's/^/     | /'
  fi
done
grep -q "parameters, bf16;" "$DIR/bf16.log" && pass "the bf16 run's header says bf16" || bad "the bf16 run's header does not say bf16"
grep -q "parameters, fp32;" "$DIR/fp32.log" && pass "the fp32 run's header says fp32" || bad "the fp32 run's header does not say fp32"

# check.py FP32 BF16 [SCALE_STEP]: every step within 5e-2 relative, the bf16 loss falling (last step below
# 0.6 x the first); SCALE_STEP multiplies that step's bf16 loss by 1.06, the negative case.
cat >"$DIR/check.py" <<'PY'
import json, sys
def losses(path): return [r["loss"] for r in map(json.loads, open(path)) if r.get("record") == "step"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
if len(sys.argv) > 3: b[int(sys.argv[3]) - 1] *= 1.06
if len(a) != 60 or len(b) != 60: sys.exit(f"expected 60 steps, got {len(a)} and {len(b)}")
worst = max(range(60), key=lambda i: abs(b[i] - a[i]) / a[i])
rel = abs(b[worst] - a[worst]) / a[worst]
print(f"largest relative difference {rel:.4f} at step {worst + 1}; bf16 loss {b[0]:.4f} -> {b[-1]:.4f}")
sys.exit(0 if rel <= 5e-2 and b[-1] < 0.6 * b[0] else 1)
PY
if out=$(python3 "$DIR/check.py" "$DIR/fp32.jsonl" "$DIR/bf16.jsonl"); then pass "bf16 within 5e-2 of fp32 at all 60 steps, falling: $out"
else bad "bf16 against fp32: $out"; fi
python3 "$DIR/check.py" "$DIR/fp32.jsonl" "$DIR/bf16.jsonl" 30 >/dev/null \
  && bad "a 6% change at step 30 passed the check" || pass "a 6% change at step 30 fails the check"
[[ $fail -eq 0 ]] && echo "bf16: all passed" || echo "bf16: FAILED"
exit $fail
