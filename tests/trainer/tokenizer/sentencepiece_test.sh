#!/bin/bash
# SentencePiece .model files through libsentencepiece against Debian's python3-sentencepiece (the same library:
# this checks meshrun's use of it). A Llama-2-like BPE model (byte fallback, identity normalization, split
# digits, user-defined pieces) is trained at test time on make_corpus.py's text; meshrun-tokenize's ids on the
# ~1 MB corpus must equal python's encode(add_bos=True), decode must give the corpus back, the Megatron output
# must start with BOS and end with EOS; a model without EOS is refused for Megatron output.
# usage: sentencepiece_test.sh MESHRUN_TOKENIZE TOKENIZER_CHECK SOURCE_DIR BUILD_DIR
set -u
TOKENIZE=$1 CHECK=$2 SRC=$3
PY=/usr/bin/python3   # Debian's, which has python3-sentencepiece
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
DIR=$(mktemp -d /tmp/meshrun-tok-spm.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
$PY "$SRC/make_corpus.py" "$DIR/corpus.txt" || exit 1
$PY "$SRC/make_corpus.py" "$DIR/train.txt" 300000 || exit 1
train() {  # train PREFIX EXTRA_FLAGS...
  local prefix=$1; shift
  spm_train --input="$DIR/train.txt" --model_prefix="$prefix" --vocab_size=1500 --model_type=bpe --byte_fallback=true \
    --normalization_rule_name=identity --remove_extra_whitespaces=false --split_digits=true \
    --allow_whitespace_only_pieces=true --character_coverage=0.9995 --num_threads=1 --minloglevel=2 \
    --user_defined_symbols='<|im_start|>,<|im_end|>' "$@" >"$prefix.log" 2>&1 || { bad "spm_train: $(tail -1 "$prefix.log")"; exit 1; }
}
train "$DIR/spm"
M=$DIR/spm.model

$PY - "$M" "$DIR/corpus.txt" "$DIR/ref.u32" <<'PYEOF' || { bad "python3-sentencepiece failed"; exit 1; }
import array, sys
import sentencepiece as spm
sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
ids = sp.encode(open(sys.argv[2], encoding="utf-8", newline="").read(), add_bos=True)
array.array("I", ids).tofile(open(sys.argv[3], "wb"))
bytes_ = sum(1 for i in ids if sp.is_byte(i))
user = sum(1 for i in ids if sp.id_to_piece(i) in ("<|im_start|>", "<|im_end|>"))
print(f"python ids {len(ids)}, byte-fallback ids {bytes_}, user-defined pieces {user}, bos {sp.bos_id()} eos {sp.eos_id()}")
PYEOF

"$TOKENIZE" "$DIR/got.u32" "$DIR/corpus.txt" --tokenizer "$M" --format raw --dtype uint32 >"$DIR/raw.log" 2>&1 ||
  bad "meshrun-tokenize --format raw: $(tail -1 "$DIR/raw.log")"
if out=$("$CHECK" compare "$M" "$DIR/got.u32" "$DIR/ref.u32"); then pass "spm: $out"; else bad "spm: $out"; fi
if out=$("$CHECK" roundtrip "$M" "$DIR/got.u32" "$DIR/corpus.txt"); then pass "spm: $out"; else bad "spm: $out"; fi

# Megatron output: one document, BOS first, EOS last, the ids between equal to the raw stream.
"$TOKENIZE" "$DIR/mega" "$DIR/corpus.txt" --tokenizer "$M" --dtype uint16 >"$DIR/mega.log" 2>&1 ||
  bad "meshrun-tokenize megatron: $(tail -1 "$DIR/mega.log")"
"$CHECK" idx "$DIR/mega" >"$DIR/mega.txt" || bad "reading mega.idx back"
$PY - "$DIR/mega.txt" "$DIR/ref.u32" <<'PYEOF' && pass "spm megatron: BOS 1 first, EOS 2 last, one document" || bad "spm megatron output"
import array, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0].startswith("documents 1 "), lines[0]
ids = [int(x) for x in lines[1].split()]
ref = array.array("I"); ref.frombytes(open(sys.argv[2], "rb").read())
assert ids[0] == 1 and ids[-1] == 2 and ids[:-1] == list(ref), (ids[:3], ids[-3:])
PYEOF

# A model without EOS (eos_id=-1): raw output works, Megatron output is refused in one line.
train "$DIR/noeos" --eos_id=-1
out=$("$TOKENIZE" "$DIR/x" "$DIR/corpus.txt" --tokenizer "$DIR/noeos.model" 2>&1); rc=$?
if [[ $rc -eq 2 && $(wc -l <<<"$out") -eq 1 && $out == *"no EOS token"* ]]; then pass "no EOS refused: $out"; else bad "no EOS (rc $rc): $out"; fi
"$TOKENIZE" "$DIR/x.u16" "$DIR/corpus.txt" --tokenizer "$DIR/noeos.model" --format raw >/dev/null 2>&1 && pass "no EOS, raw output works" || bad "no EOS raw"
exit $fail
