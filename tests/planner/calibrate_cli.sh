#!/bin/bash
# meshrun plan --calibrate on runs meshrun-train measured (issue 30, items 1-2): meshrun-bench-device writes
# the machine's figures; three short runs of tiny (one rank, tp 2, pp 2 with 1F1B; 8 steps each) are fitted and
# `meshrun plan --estimate --calibration FIT` prints the estimate the fit reported; the metrics carry what the
# fit reads (host, micro-batch size, kernel_ms per kind). The same three layouts recorded on a quiet machine
# (fixtures/calibration, written by meshrun-train and meshrun-bench-device) must each be within 10% after the
# fit. Refusals, one line, exit 2: no base calibration, a GPU base for CPU runs, a run with too few steps, a
# file that is not metrics, an unknown key in a calibration file (file:line:column), a CPU run planned without
# calibration. The held-out accuracy is bench/calibrate_bench.sh's.
# usage: calibrate_cli.sh MESHRUN MESHRUN_TRAIN MESHRUN_BENCH_DEVICE TEMPLATE MPIRUN
set -u
PLAN=$1 TRAIN=$2 BENCH=$3 TEMPLATE=$4 MPIRUN=$5
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-calibrate-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/../trainer/cli_lib.sh"
plan() { env -i PATH="$PATH" "$PLAN" plan --no-site "$@"; }

"${MPI[@]}" -np 2 "$BENCH" --seconds 0.2 >"$DIR/cpu.toml" 2>"$DIR/bench.err" &&
  grep -q '^device = "cpu"$' "$DIR/cpu.toml" && grep -qE '^gflops_per_cpu = [0-9.e+]+' "$DIR/cpu.toml" &&
  pass "meshrun-bench-device wrote a calibration file: $(grep -E '^(gflops_per_cpu|memory_gbps_per_cpu|link_gbps) ' "$DIR/cpu.toml" | cut -d'#' -f1 | tr -s ' \n' ' ')" ||
  { bad "meshrun-bench-device failed"; cat "$DIR/bench.err" "$DIR/cpu.toml"; exit 1; }
expect 2 "one rank measures no MPI link" "meshrun-bench-device refuses one rank" -- "${MPI[@]}" -np 1 "$BENCH"

mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
common=(--set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin" --set training.steps=8)
run() {  # NAME RANKS ARGS...: a metrics file of tiny
  local name=$1 np=$2; shift 2
  "${MPI[@]}" -np "$np" "$TRAIN" "$TEMPLATE" "${common[@]}" --set cluster.gpus_per_node="$np" "$@" \
    --metrics "$DIR/$name.jsonl" >"$DIR/$name.log" 2>&1 || { bad "$name: meshrun-train failed"; tail -5 "$DIR/$name.log"; exit 1; }
}
run one 1 --set parallel.tp=1
run tp2 2 --set parallel.tp=2
run pp2 2 --set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=1f1b
python3 - "$DIR/tp2.jsonl" <<'PY' && pass "metrics: run record has host and micro_batch_size, steps have kernel_ms (linear_forward > 0, the kinds sum below the step)" || bad "metrics lack what --calibrate reads"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
run = recs[0]
assert run["record"] == "run" and run["micro_batch_size"] == 4 and run["host"]["ranks_per_node"] == 2 and run["host"]["node_cpus"] >= 1, run
for s in recs[1:]:
    k = s["kernel_ms"]
    assert len(k) == 15 and k["linear_forward"] > 0 and k["attention_forward"] > 0, k
    assert sum(k.values()) < 1.5 * s["ms_per_step"], (sum(k.values()), s["ms_per_step"])
PY

expect 0 "wrote $DIR/fit.toml" "--calibrate fits the three runs measured here and writes the file" -- \
  plan --calibrate "$DIR/one.jsonl" "$DIR/tp2.jsonl" "$DIR/pp2.jsonl" --calibration "$DIR/cpu.toml" -o "$DIR/fit.toml"
cp "$DIR/out" "$DIR/fit.out"
sed 's/^/     | /' "$DIR/fit.out"
# The accuracy of the fit on runs recorded here on a quiet machine (bench/calibrate_bench.sh --save-fixtures:
# meshrun-train's metrics and meshrun-bench-device's figures, not edited): each run within 10% after the fit.
# (The runs measured above are not held to it: under the load of other tests their steps scatter by up to 3x.)
FIX=$(dirname "$0")/fixtures/calibration
expect 0 "wrote $DIR/fixtures-fit.toml" "--calibrate on the recorded runs" -- plan --calibrate "$FIX/tiny-tp2.jsonl" \
  "$FIX/tiny-dp2-zero1.jsonl" "$FIX/mid-1.jsonl" --calibration "$FIX/cpu.toml" -o "$DIR/fixtures-fit.toml"
sed 's/^/     | /' "$DIR/out"
for name in tiny-tp2 tiny-dp2-zero1 mid-1; do
  line=$(sed "/^run: by part/q" "$DIR/out" | grep "/$name.jsonl ")
  after=$(echo "$line" | awk '{print $NF}' | tr -d '%+-')
  if [[ -n $after ]] && python3 -c "import sys; sys.exit(0 if float('$after') <= 10 else 1)"; then
    pass "$name (recorded): after the fit within 10% of its measured median ($(echo "$line" | awk '{print $(NF-1), $NF}'))"
  else bad "$name (recorded): after the fit: ${after:-?}%"; fi
done
# Each run's parts after the fit (five columns: the four kernel groups and the time outside them), and a
# constant no run depends on (the MoE routing cost, with no MoE run here) named as not fitted.
grep -qE "^run: by part +matmul +attn +elemwise +optim +outside" "$DIR/out" &&
  sed -n '/^run: by part/,$p' "$DIR/out" | grep "/mid-1.jsonl " | grep -qE "( +[+-][0-9.]+%){5}$" &&
  sed -n '/^run: by part/,$p' "$DIR/out" | grep "/tiny-tp2.jsonl " | grep -qE "( +[+-][0-9.]+%){5}$" &&
  pass "the parts after the fit, per run" || bad "no per-part table, or a part missing"
grep -qE "^not fitted \(no run depends on them.*routing_assignment_s" "$DIR/out" &&
  ! grep -E "^not fitted" "$DIR/out" | grep -q "matmul_efficiency" &&
  pass "routing_assignment_s named as not fitted (no MoE run), matmul_efficiency not" ||
  bad "the unconstrained constants are not reported as such"
# --estimate with the fitted file prints the estimate the fit reported for that run.
fit_ms=$(sed "/^run: by part/q" "$DIR/fit.out" | grep "/tp2.jsonl " | awk '{print $(NF-1)}')
plan "$TEMPLATE" --estimate --format json --calibration "$DIR/fit.toml" --set cluster.gpus_per_node=2 --set parallel.tp=2 \
  >"$DIR/est.json" 2>"$DIR/est.err"
python3 - "$DIR/est.json" "$fit_ms" "$DIR/fit.toml" <<'PY' && pass "--estimate --calibration FIT: tp2's step = the fit's figure ($fit_ms ms), the file named" || { bad "--estimate with the fit differs"; cat "$DIR/est.err"; }
import json, sys
e = json.load(open(sys.argv[1]))["estimate"]
assert abs(e["step_time_s"] * 1000 - float(sys.argv[2])) < 0.01 * float(sys.argv[2]), (e["step_time_s"], sys.argv[2])
assert e["hardware"]["calibration"] == sys.argv[3] and e["hardware"]["gpu"] == "cpu", e["hardware"]
PY
grep -q "^fitted_runs = 3$" "$DIR/fit.toml" && grep -q "^matmul_efficiency = " "$DIR/fit.toml" &&
  pass "the file records the fitted constants and the run count" || bad "fit.toml lacks the constants"
expect 0 "calibration $DIR/fit.toml" "the table names the calibration" -- plan "$TEMPLATE" --estimate --calibration "$DIR/fit.toml"

# Refusals.
expect 2 "give --calibration FILE" "--calibrate without a base" -- plan --calibrate "$DIR/one.jsonl"
printf '[planner]\ndevice = "h100-sxm"\n' >"$DIR/h100.toml"
expect 2 "calibrate runs of one device type together" "CPU runs against a GPU base" -- \
  plan --calibrate "$DIR/one.jsonl" --calibration "$DIR/h100.toml"
head -3 "$DIR/one.jsonl" >"$DIR/short.jsonl"
expect 2 "2 step record(s); calibration needs at least 3" "a run with 2 steps" -- \
  plan --calibrate "$DIR/short.jsonl" --calibration "$DIR/cpu.toml"
expect 2 "not a metrics record" "a file that is not metrics" -- plan --calibrate "$TEMPLATE" --calibration "$DIR/cpu.toml"
printf '[planner]\ndevice = "cpu"\nlink_gbps = 5\ngflops_per_cpus = 9\n' >"$DIR/typo.toml"
expect 2 "typo.toml:4:1: unknown key planner.gflops_per_cpus" "an unknown key, located" -- \
  plan "$TEMPLATE" --estimate --calibration "$DIR/typo.toml"
expect 2 "meshrun-bench-device > cpu.toml" "a CPU run planned without a calibration" -- plan "$TEMPLATE" --estimate
[[ $(wc -l <"$DIR/out") -eq 1 ]] && pass "in one line" || bad "the refusal is not one line"
exit $fail
