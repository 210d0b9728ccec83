#!/bin/bash
# End-to-end checks of meshrun-train / meshrun-tokenize as a user runs them (real mpirun, real files).
# usage: cli_test.sh MESHRUN_TRAIN MESHRUN_TOKENIZE TEMPLATE MPIRUN
set -u
TRAIN=$1 TOKENIZE=$2 TEMPLATE=$3 MPIRUN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-cli-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
# The loss of every step record of a metrics file.
losses() { sed -n '/"record":"step"/s/.*"loss":\([0-9.e+-]*\).*/\1/p' "$1"; }

# 1. The demo: TP 2 x DP 2, ZeRO-1 on 4 ranks; corpus built at run time from the Debian license texts.
expect 0 "step    20/20" "tiny.toml trains on 4 ranks" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" \
  --set data.text=/usr/share/common-licenses --set data.text_cache="$DIR/corpus.bin" --set training.steps=20 \
  --set checkpoint.save="$DIR/tiny.safetensors" --metrics "$DIR/m.jsonl"
lines=$(grep -c '"record":"step"' "$DIR/m.jsonl" 2>/dev/null)
[[ $lines -eq 20 && $(wc -l <"$DIR/m.jsonl") -eq 21 ]] && head -1 "$DIR/m.jsonl" | grep -q '^{"record":"run","schema":1,' &&
  pass "metrics: a run record, then one step record per step" || bad "metrics has $lines step records (expected 20) or no run record first"
# MFU: on every step line and in every step record, from the peak the banner names.
grep -qE '^meshrun-train: MFU = [0-9.e+]+ GFLOP of model FLOPs per step .* / peak [0-9.e+]+ GFLOP/s \(measured: 4 ranks at once, fp32 matmul' "$DIR/out" &&
  [[ $(grep -cE '^step +[0-9]+/20 \| .* [0-9]+ tok/s global \| MFU [0-9]+\.[0-9]% \| ' "$DIR/out") -eq 20 ]] &&
  [[ $(grep -cE '"mfu":(0\.[0-9]*[1-9][0-9]*|[1-9][0-9.e-]*),' "$DIR/m.jsonl") -eq 20 ]] &&
  pass "MFU: the banner names the measured peak, every step line and record has a positive MFU" ||
  bad "MFU missing: $(grep -E 'MFU|^step +20/' "$DIR/out")"
# Progress: elapsed on every step line, an ETA before the last; a summary line with this run's steps and
# tokens (20 steps × 16 sequences × 64 tokens) and what was saved (no checkpoint.dir here).
grep -qE '^step    19/20 \| .* \| [0-9][0-9hms. ]* elapsed, ETA [0-9][0-9hms. ]*$' "$DIR/out" && grep -qE '^step    20/20 \| .* \| [0-9][0-9hms. ]* elapsed$' "$DIR/out" &&
  pass "step lines: elapsed, and an ETA until the last step" || bad "step lines lack elapsed/ETA: $(grep -E '^step    (19|20)/' "$DIR/out")"
grep -qE '^meshrun-train: finished steps 1\.\.20 \(20 in this run\) in [0-9][0-9hms. ]* from .*: 20480 tokens, [0-9]+ tok/s \(all ranks, mean\), MFU [0-9]+\.[0-9]% \(mean\); last loss [0-9.]+; no checkpoint.dir: nothing saved to resume from$' "$DIR/out" &&
  pass "summary line: 20 steps, 20480 tokens, nothing saved" || bad "summary line: $(grep finished "$DIR/out")"
first=$(losses "$DIR/m.jsonl" | head -1)
last=$(losses "$DIR/m.jsonl" | tail -1)
for key in step loss grad_norm lr tokens_per_s mfu elapsed_s; do
  grep -q "\"$key\":" "$DIR/m.jsonl" || bad "metrics lack \"$key\""
done
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }'; then pass "loss falls visibly ($first -> $last)";
else bad "loss did not fall by 1.0 ($first -> $last)"; fi
# Exposed data-parallel communication: dp = 2 waits for its gradient reduce-scatters somewhere in 20 steps
# (the flat run below, dp = 1, must show exactly none).
exposed=$(sed -n 's/.*"comm_exposed_ms":\([0-9.e+-]*\).*/\1/p' "$DIR/m.jsonl" | awk '{ s += $1; n++ } END { if (n == 20) print s }')
if awk -v a="$exposed" 'BEGIN { exit !(a != "" && a > 0) }'; then pass "dp = 2: comm_exposed_ms in every line, ${exposed} ms over 20 steps";
else bad "dp = 2: comm_exposed_ms missing from some line or never positive ('$exposed')"; fi

# 2. Fine-tuning start: the saved safetensors loads on a different layout (tp 1 x dp 2, ZeRO-3) and
#    continues from the trained weights (first loss well below ln 256 = 5.55).
expect 0 "step     1/1" "checkpoint.load on another layout" -- "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" \
  --set parallel.tp=1 --set parallel.zero_stage=3 --set data.path="$DIR/corpus.bin" --set training.steps=1 \
  --set checkpoint.load="$DIR/tiny.safetensors" --metrics "$DIR/m2.jsonl"
l2=$(losses "$DIR/m2.jsonl")
awk -v a="$l2" 'BEGIN { exit !(a < 4.5) }' && pass "loaded weights are the trained ones (loss $l2)" || bad "loaded model loss $l2 is not trained"

# 2b. Pipeline parallelism: TP 2 x PP 2 (1F1B) and the interleaved schedule with 2 virtual stages; the
#     loss falls as with pp = 1, and the pp = 2 run's losses equal the pp = 1 run's (same layout otherwise).
expect 0 "pipeline 1f1b, 2 stages" "tiny.toml trains with pp = 2" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" \
  --set parallel.pp=2 --set data.path="$DIR/corpus.bin" --set training.steps=20 --metrics "$DIR/pp.jsonl"
pf=$(losses "$DIR/pp.jsonl" | head -1)
pl=$(losses "$DIR/pp.jsonl" | tail -1)
if awk -v a="$pf" -v b="$pl" 'BEGIN { exit !(b < a - 1.0) }'; then pass "pp = 2: loss falls visibly ($pf -> $pl)";
else bad "pp = 2: loss did not fall by 1.0 ($pf -> $pl)"; fi
grep -q '"pipeline_wait_ms":' "$DIR/pp.jsonl" && pass "metrics carry pipeline_wait_ms" || bad "metrics lack pipeline_wait_ms"
expect 0 "step    20/20" "same layout without a pipeline (tp 2, dp 2 -> tp 2 x dp 1 on 2 ranks)" -- "${MPI[@]}" -np 2 \
  "$TRAIN" "$TEMPLATE" --set data.path="$DIR/corpus.bin" --set training.steps=20 --metrics "$DIR/flat.jsonl"
if diff <(losses "$DIR/pp.jsonl") <(losses "$DIR/flat.jsonl") >/dev/null;
then pass "pp = 2 losses equal pp = 1 losses, all 20 steps"; else bad "pp = 2 losses differ from pp = 1"; fi
nonzero=$(sed -n 's/.*"comm_exposed_ms":\([0-9.e+-]*\).*/\1/p' "$DIR/flat.jsonl" | awk '$1 != 0 { n++ } END { print NR == 20 ? n + 0 : "missing" }')
[[ $nonzero == 0 ]] && pass "dp = 1: comm_exposed_ms is 0 in all 20 steps" || bad "dp = 1: comm_exposed_ms not 0 ($nonzero)"
expect 0 "pipeline interleaved, 2 stages × 2 virtual" "tiny.toml trains interleaved (V = 2)" -- "${MPI[@]}" -np 4 \
  "$TRAIN" "$TEMPLATE" --set parallel.pp=2 --set parallel.pipeline_schedule=interleaved \
  --set parallel.virtual_stages=2 --set data.path="$DIR/corpus.bin" --set training.steps=20 --metrics "$DIR/il.jsonl"
if diff <(losses "$DIR/il.jsonl") <(losses "$DIR/flat.jsonl") >/dev/null;
then pass "interleaved losses equal pp = 1 losses"; else bad "interleaved losses differ from pp = 1"; fi

# 2c. Context parallelism: TP 2 x CP 2 on 256-token sequences (ring attention); the loss falls.
expect 0 "step    10/10" "tiny.toml trains with cp = 2, seq_len 256" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" \
  --set parallel.cp=2 --set training.seq_len=256 --set data.path="$DIR/corpus.bin" --set training.steps=10 \
  --metrics "$DIR/cp.jsonl"
grep -q "layout tp=2 cp=2 pp=1 dp=1 ep=1 zero=" "$DIR/out" && pass "the header names every axis (cp = 2)" || bad "header: $(grep layout "$DIR/out")"
cf=$(losses "$DIR/cp.jsonl" | head -1)
cl=$(losses "$DIR/cp.jsonl" | tail -1)
if awk -v a="$cf" -v b="$cl" 'BEGIN { exit !(b < a - 1.0) }'; then pass "cp = 2: loss falls visibly ($cf -> $cl)";
else bad "cp = 2: loss did not fall by 1.0 ($cf -> $cl)"; fi
expect 2 "2·cp = 4" "a seq_len the zigzag split cannot cut is refused" -- "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" \
  --set parallel.cp=2 --set training.seq_len=250 --set data.path="$DIR/corpus.bin"

# 3. Bad input: one line, exit 2.
expect 2 "needs 4 ranks but MPI started 2" "world size differs from the layout" -- "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" \
  --set parallel.tp=2 --set parallel.dp=2 --set data.path="$DIR/corpus.bin"
expect 2 "none.bin: no such file" "missing token file" -- "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set data.text= \
  --set data.path="$DIR/none.bin"
expect 2 "missing.txt" "missing data.text input" -- "$TRAIN" "$TEMPLATE" --set parallel.tp=1 \
  --set data.text="$DIR/missing.txt" --set data.text_cache="$DIR/none.bin"
[[ ! -e $DIR/none.bin ]] && pass "no partial token file left behind" || bad "a token file was left behind"
: >"$DIR/empty.bin"
expect 2 "is empty" "empty token file" -- "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set data.path="$DIR/empty.bin"
head -c 100 "$DIR/corpus.bin" >"$DIR/short.bin"
expect 2 "fewer than one batch" "too-short token file" -- "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set data.path="$DIR/short.bin"
mkfifo "$DIR/fifo.bin"
# No address-space cap on ASan-built binaries (terabytes of shadow); ASan's hard_rss_limit_mb bounds them instead.
as_cap=2000000000
[ -z "${MESHRUN_SANITIZE:-}" ] || as_cap=unlimited
expect 2 "not a regular file" "a FIFO as the token file is refused, not waited on" -- timeout 20 "$TRAIN" "$TEMPLATE" \
  --set parallel.tp=1 --set data.path="$DIR/fifo.bin"
expect 2 "regular file" "/dev/zero as checkpoint.load is refused, not read" -- timeout 20 prlimit --as="$as_cap" "$TRAIN" \
  "$TEMPLATE" --set parallel.tp=1 --set data.path="$DIR/corpus.bin" --set checkpoint.load=/dev/zero
expect 2 "did you mean" "misspelled --set key" -- "$TRAIN" "$TEMPLATE" --set trainin.steps=2
expect 2 "virtual_stages" "virtual stages without the interleaved schedule are refused" -- "${MPI[@]}" -np 4 \
  "$TRAIN" "$TEMPLATE" --set parallel.pp=2 --set parallel.virtual_stages=2 --set data.path="$DIR/corpus.bin"
expect 2 "micro-batches" "a pipeline with fewer micro-batches than stages is refused" -- "${MPI[@]}" -np 4 \
  "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set parallel.pp=4 --set training.global_batch_size=4 \
  --set data.path="$DIR/corpus.bin"
expect 2 "checkpoint.load" "missing checkpoint" -- "$TRAIN" "$TEMPLATE" --set parallel.tp=1 \
  --set data.path="$DIR/corpus.bin" --set checkpoint.load="$DIR/none.safetensors"
expect 2 "not writable" "checkpoint.save into a missing directory (checked before training)" -- "$TRAIN" "$TEMPLATE" \
  --set parallel.tp=1 --set data.path="$DIR/corpus.bin" --set checkpoint.save="$DIR/no/such/dir/x.safetensors"
expect 2 "no template" "no arguments" -- "$TRAIN"
expect 2 "the launcher placed this task at MESHRUN_TP_RANK=1" "coordinates from a launcher that disagree with the trainer's map" -- \
  env MESHRUN_LAYOUT=tp=2 MESHRUN_TP_RANK=1 MESHRUN_TP_SIZE=2 "${MPI[@]}" -np 4 "$TRAIN" "$TEMPLATE" --set training.steps=1

# 4. Tokenizer.
printf 'hello' >"$DIR/h.txt"
expect 0 "wrote 5 tokens" "meshrun-tokenize" -- "$TOKENIZE" "$DIR/h.bin" "$DIR/h.txt"
[[ $(stat -c %s "$DIR/h.bin") -eq 10 ]] && pass "uint16 tokens on disk" || bad "h.bin size"
: >"$DIR/e.txt"
expect 2 "no bytes" "tokenizing an empty file" -- "$TOKENIZE" "$DIR/e.bin" "$DIR/e.txt"
expect 2 "usage" "tokenizer without inputs" -- "$TOKENIZE" "$DIR/x.bin"
exit $fail
