#!/bin/bash
# The planner's CPU model against meshrun-train on this machine (issue 30, item 3; not a test): the machine's
# figures from meshrun-bench-device, 13 layouts of tiny, tiny-moe and a mid-sized model on 1-2 ranks (one
# rank per CPU, so the ranks do not share cores), each run REPS times round-robin (interleaved: load from
# other processes hits every layout alike). `meshrun plan --calibrate` fits on 3 of them (every repetition of
# tiny at tp 2, tiny-moe at ep 2 with dp 2 and ZeRO-1, the mid model on 1 rank: between them every constant of
# the CPU model has a run whose time depends on it — TP collectives, DP collectives, the all-to-all and the
# host's routing, a larger model's GEMMs and attention); the other 10 are estimated with the bench's figures
# alone (before) and with the fit (after), against each layout's median over repetitions of its median step
# (steps 2..N).
# A MoE layout is estimated with its measured routing imbalance (planner.expert_imbalance = the median over
# steps 2..N and repetitions of the metrics' expert_rank_imbalance), an input, not a fit.
# A held-out layout passes when it is within 10%, or within twice its run-to-run spread, whichever is larger
# (spread = (max - min) / median of the repetitions' medians).
# usage: bench/calibrate_bench.sh [BUILD_DIR] [REPS] [--save-fixtures DIR]    (from the repository root)
#   KEEP=DIR keeps the runs' metrics and the figures there; FROM=DIR evaluates such a directory again without
#   running anything (FIT="name name name" picks another calibration set; the report says which was used).
set -eu
BUILD=${1:-build}
REPS=${2:-5}
SAVE=""
[ "${3:-}" = "--save-fixtures" ] && SAVE=${4:?--save-fixtures needs a directory}
TRAIN=$BUILD/trainer/meshrun-train PLAN=$BUILD/launcher/meshrun BENCH=$BUILD/bench/meshrun-bench-device
for b in "$TRAIN" "$PLAN" "$BENCH"; do [ -x "$b" ] || { echo "calibrate_bench: $b not found; build first" >&2; exit 2; }; done
if [ -n "${FROM:-}" ]; then OUT=$FROM
elif [ -n "${KEEP:-}" ]; then OUT=$KEEP; mkdir -p "$OUT"
else OUT=$(mktemp -d /tmp/meshrun-calibrate-bench-XXXXXX); trap 'rm -rf "$OUT"' EXIT; fi
MPI=(mpirun --allow-run-as-root --oversubscribe --mca mpi_yield_when_idle 1)
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) CPUs; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
[ -n "${FROM:-}" ] || "${MPI[@]}" -np 2 "$BENCH" >"$OUT/cpu.toml"
grep -E '^(node_cpus|gflops|memory_gbps|link_gbps|collective)' "$OUT/cpu.toml" | cut -d'#' -f1 | tr -s ' ' | paste -sd';' | sed 's/^/device: /'

TINY=templates/tiny.toml MOE=templates/tiny-moe.toml
data=(--set data.text=/usr/share/common-licenses --set data.text_cache="$OUT/corpus.bin" --set data.shuffle=true)
mid=(--set model.layers=8 --set model.hidden=512 --set model.ffn_hidden=1408 --set model.heads=8 --set model.kv_heads=4
     --set training.seq_len=256 --set training.global_batch_size=8 --set training.micro_batch_size=2)
# name|use|template|ranks|steps|options (use: fit = calibration set, check = held out)
LAYOUTS=(
  "tiny-1|check|$TINY|1|20|--set parallel.tp=1"
  "tiny-tp2|fit|$TINY|2|20|--set parallel.tp=2"
  "tiny-pp2-1f1b|check|$TINY|2|20|--set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=1f1b"
  "tiny-pp2-zb|check|$TINY|2|20|--set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=zb"
  "tiny-pp2-gpipe|check|$TINY|2|20|--set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=gpipe"
  "tiny-cp2|check|$TINY|2|20|--set parallel.tp=1 --set parallel.cp=2 --set training.seq_len=128"
  "tiny-dp2-zero1|check|$TINY|2|20|--set parallel.tp=1 --set parallel.zero_stage=1"
  "tiny-dp2-zero3|check|$TINY|2|20|--set parallel.tp=1 --set parallel.zero_stage=3"
  "moe-ep2|fit|$MOE|2|20|--set parallel.ep=2"
  "mid-1|fit|$TINY|1|5|${mid[*]} --set parallel.tp=1"
  "mid-tp2|check|$TINY|2|5|${mid[*]} --set parallel.tp=2"
  "mid-pp2-zb|check|$TINY|2|5|${mid[*]} --set parallel.tp=1 --set parallel.pp=2 --set parallel.pipeline_schedule=zb"
  "mid-cp2|check|$TINY|2|5|${mid[*]} --set parallel.tp=1 --set parallel.cp=2"
)
[ -n "${FROM:-}" ] ||
  "$TRAIN" "$TINY" "${data[@]}" --set cluster.gpus_per_node=1 --set parallel.tp=1 --set training.steps=1 --no-metrics >/dev/null
for rep in $(seq "$REPS"); do
  [ -n "${FROM:-}" ] && break
  for entry in "${LAYOUTS[@]}"; do
    IFS='|' read -r name use tmpl np steps opts <<<"$entry"
    # shellcheck disable=SC2086  # the options split into words on purpose
    "${MPI[@]}" -np "$np" "$TRAIN" "$tmpl" "${data[@]}" --set cluster.gpus_per_node="$np" --set training.steps="$steps" \
      --set training.straggler_interval=0 $opts --metrics "$OUT/$name.$rep.jsonl" >"$OUT/$name.$rep.log" 2>&1 ||
      { echo "calibrate_bench: $name rep $rep failed:"; tail -5 "$OUT/$name.$rep.log"; exit 1; }
  done
  echo "repetition $rep of $REPS done, load $(cut -d' ' -f1 /proc/loadavg)"
done

if [ -n "${FIT:-}" ]; then  # another calibration set: those names fitted, every other layout checked
  for i in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name use rest <<<"${LAYOUTS[$i]}"
    use=check; for f in $FIT; do [ "$f" = "$name" ] && use=fit; done
    LAYOUTS[i]="$name|$use|$rest"
  done
fi
fits=()
for entry in "${LAYOUTS[@]}"; do
  IFS='|' read -r name use _ <<<"$entry"
  [ "$use" = fit ] && for rep in $(seq "$REPS"); do fits+=("$OUT/$name.$rep.jsonl"); done
done
echo "== calibration on ${#fits[@]} runs (3 layouts × $REPS)"
grep -h '"record":"step"' "$OUT"/moe-ep2.*.jsonl | head -1 | grep -q expert_rank_imbalance || { echo "calibrate_bench: no expert_rank_imbalance in the MoE metrics"; exit 1; }
"$PLAN" plan --no-site --calibrate "${fits[@]}" --calibration "$OUT/cpu.toml" -o "$OUT/fit.toml" | sed "s|$OUT/||g"

step_median() {  # the median over steps 2..N of one metrics file
  grep '"record":"step"' "$1" | tail -n +2 | sed 's/.*"ms_per_step":\([0-9.e+-]*\).*/\1/' | median
}
imbalance() {  # NAME: the median expert_rank_imbalance over steps 2..N of every repetition
  for rep in $(seq "$REPS"); do
    grep '"record":"step"' "$OUT/$1.$rep.jsonl" | tail -n +2 | sed -n 's/.*"expert_rank_imbalance":\([0-9.e+-]*\).*/\1/p'
  done | median
}
estimate_ms() {  # CALIBRATION TEMPLATE RANKS OPTIONS...
  local cal=$1 tmpl=$2 np=$3; shift 3
  "$PLAN" plan --no-site "$tmpl" --estimate --format json --calibration "$cal" --set cluster.gpus_per_node="$np" "$@" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["estimate"]["step_time_s"] * 1000)'
}
echo "== held-out layouts: median of $REPS repetitions (spread = (max - min) / median), estimate before and after"
printf '%-16s %10s %7s %10s %8s %10s %8s  %s\n' layout measured spread before error after error verdict
sum_b=0 sum_a=0 n=0 passed=0
for entry in "${LAYOUTS[@]}"; do
  IFS='|' read -r name use tmpl np steps opts <<<"$entry"
  meds=$(for rep in $(seq "$REPS"); do step_median "$OUT/$name.$rep.jsonl"; done)
  m=$(echo "$meds" | median)
  spread=$(echo "$meds" | sort -g | awk -v m="$m" 'NR == 1 { lo = $1 } { hi = $1 } END { print (hi - lo) / m }')
  if [ "$tmpl" = "$MOE" ]; then
    imb=$(imbalance "$name")
    opts="$opts --set planner.expert_imbalance=$imb"
    echo "$name: measured routing imbalance $imb (expert_rank_imbalance)"
  fi
  # shellcheck disable=SC2086
  b=$(estimate_ms "$OUT/cpu.toml" "$tmpl" "$np" $opts)
  # shellcheck disable=SC2086
  a=$(estimate_ms "$OUT/fit.toml" "$tmpl" "$np" $opts)
  read -r eb ea verdict <<<"$(python3 -c "
m, s, b, a = $m, $spread, $b, $a
eb, ea = b / m - 1, a / m - 1
print('%+.1f%% %+.1f%% %s' % (100 * eb, 100 * ea, 'ok' if abs(ea) <= max(0.10, 2 * s) else 'MISS'))")"
  if [ "$use" = check ]; then
    n=$((n + 1))
    [ "$verdict" = ok ] && passed=$((passed + 1))
    sum_b=$(python3 -c "print($sum_b + abs($b / $m - 1))"); sum_a=$(python3 -c "print($sum_a + abs($a / $m - 1))")
  else verdict="(fitted on)"; fi
  printf '%-16s %10.2f %6.1f%% %10.2f %8s %10.2f %8s  %s\n' "$name" "$m" "$(python3 -c "print(100 * $spread)")" "$b" "$eb" "$a" "$ea" "$verdict"
done
python3 -c "print('held out: %d of %d within max(10%%, 2 x spread); MAPE %.1f%% before, %.1f%% after calibration' % ($passed, $n, 100 * $sum_b / $n, 100 * $sum_a / $n))"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$SAVE" ]; then
  mkdir -p "$SAVE"
  cp "$OUT/cpu.toml" "$SAVE/cpu.toml"
  for entry in "${LAYOUTS[@]}"; do
    IFS='|' read -r name use _ <<<"$entry"
    [ "$use" = fit ] && cp "$OUT/$name.1.jsonl" "$SAVE/$name.jsonl"
  done
  echo "saved the device figures and repetition 1 of the 3 calibration layouts in $SAVE"
fi
