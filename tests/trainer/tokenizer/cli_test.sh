#!/bin/bash
# meshrun-tokenize as a user runs it, on a tokenizer.json (Llama 2 layout) made from a small SentencePiece model
# trained here: Megatron .bin/.idx from JSONL and plain text (BOS + ids + EOS per document, read back with
# the indexed-dataset reader), --format raw (no EOS), --json-key, byte-level mode unchanged, and every refusal
# (exit 2, one line naming the problem): unknown components, bad JSONL, invalid UTF-8, ids too large for uint16,
# no EOS, bad options.
# usage: cli_test.sh MESHRUN_TOKENIZE TOKENIZER_CHECK SOURCE_DIR BUILD_DIR
set -u
TOKENIZE=$1 CHECK=$2 SRC=$3
PY=/usr/bin/python3
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
# expect RC TEXT DESCRIPTION -- COMMAND...: exit code RC and TEXT in the output (one line when RC is 2).
expect() {
  local rc=$1 text=$2 what=$3; shift 4
  local out got
  out=$("$@" 2>&1); got=$?
  if [[ $got -ne $rc ]]; then bad "$what: exit $got, wanted $rc: $out"; return; fi
  if [[ $out != *"$text"* ]]; then bad "$what: output lacks '$text': $out"; return; fi
  if [[ $rc -eq 2 && $(wc -l <<<"$out") -ne 1 ]]; then bad "$what: more than one line: $out"; return; fi
  pass "$what: $(tail -1 <<<"$out")"
}
DIR=$(mktemp -d /tmp/meshrun-tok-cli.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
$PY "$SRC/make_corpus.py" "$DIR/train.txt" 100000 || exit 1
spm_train --input="$DIR/train.txt" --model_prefix="$DIR/spm" --vocab_size=600 --model_type=bpe --byte_fallback=true \
  --normalization_rule_name=identity --remove_extra_whitespaces=false --character_coverage=0.9995 --num_threads=1 \
  --minloglevel=2 >"$DIR/spm.log" 2>&1 || { bad "spm_train: $(tail -1 "$DIR/spm.log")"; exit 1; }
T=$DIR/tok
mkdir -p "$T"
$PY "$SRC/spm_to_json.py" "$DIR/spm.model" "$T/tokenizer.json" llama2 || exit 1
echo '{"bos_token": "<s>", "eos_token": {"content": "</s>"}}' >"$T/tokenizer_config.json"
TJ=$T/tokenizer.json

# JSONL -> Megatron: one document per line, BOS (template) + ids + EOS.
printf '%s\n' '{"text": "Hello world 123", "id": 1}' '' '{"text": "我们训练模型。 </s> 😀", "id": 2}' '{"text": "", "id": 3}' >"$DIR/docs.jsonl"
expect 0 "in 3 documents" "JSONL to Megatron" -- "$TOKENIZE" "$DIR/mega.bin" "$DIR/docs.jsonl" --tokenizer "$TJ"
"$CHECK" idx "$DIR/mega" >"$DIR/mega.txt" || bad "reading mega back"
for i in 1 2 3; do
  $PY -c 'import json,sys; l=[x for x in open(sys.argv[1]) if x.strip()][int(sys.argv[2])-1]; open(sys.argv[3],"w").write(json.loads(l)["text"])' \
    "$DIR/docs.jsonl" $i "$DIR/doc$i.txt"
  "$CHECK" encode "$TJ" "$DIR/doc$i.txt" "$DIR/doc$i.u32"
done
$PY - "$DIR/mega.txt" "$DIR"/doc{1,2,3}.u32 <<'PYEOF' && pass "Megatron documents = BOS + encode(text) + EOS, EOS 2" || bad "Megatron documents"
import array, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[0].startswith("documents 3 tokens"), lines[0]
for k, path in enumerate(sys.argv[2:]):
    want = array.array("I"); want.frombytes(open(path, "rb").read())
    got = [int(x) for x in lines[1 + k].split()]
    assert got == list(want) + [2] and got[0] == 1, (k, got, list(want))
PYEOF
# --json-key on a file of another name; plain text files and a directory are one document each.
printf '%s\n' '{"body": "one"}' '{"body": "two"}' >"$DIR/docs.txt"
expect 0 "in 2 documents" "--json-key body" -- "$TOKENIZE" "$DIR/k" "$DIR/docs.txt" --tokenizer "$TJ" --json-key body
mkdir -p "$DIR/texts"; printf 'first file' >"$DIR/texts/a.txt"; printf 'second file' >"$DIR/texts/b.txt"
expect 0 "in 3 documents" "plain files and a directory" -- "$TOKENIZE" "$DIR/p" "$DIR/doc1.txt" "$DIR/texts" --tokenizer "$TJ"
# --format raw: the bare ids, no EOS.
expect 0 "wrote" "--format raw" -- "$TOKENIZE" "$DIR/raw.u32" "$DIR/doc1.txt" --tokenizer "$TJ" --format raw --dtype uint32
cmp -s "$DIR/raw.u32" "$DIR/doc1.u32" && pass "raw ids = encode(text), no EOS" || bad "raw ids differ from encode(text)"
expect 0 "wrote" "--tokenizer DIRECTORY (its tokenizer.json)" -- "$TOKENIZE" "$DIR/rawd.u32" "$DIR/doc1.txt" --tokenizer "$T" --format raw --dtype uint32
cmp -s "$DIR/rawd.u32" "$DIR/doc1.u32" && pass "--tokenizer DIRECTORY: same ids" || bad "--tokenizer DIRECTORY: ids differ"
expect 2 "holds no tokenizer.json nor tokenizer.model" "a directory without a tokenizer" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$DIR/texts"
printf 'hello' >"$DIR/h.txt"
expect 0 "wrote 5 tokens" "byte-level mode without --tokenizer (unchanged)" -- "$TOKENIZE" "$DIR/h.bin" "$DIR/h.txt"

# Refusals.
printf 'not json\n' >"$DIR/bad.jsonl"
expect 2 "bad.jsonl line 1 is not a JSON object" "a bad JSONL line" -- "$TOKENIZE" "$DIR/x" "$DIR/bad.jsonl" --tokenizer "$TJ"
expect 2 "has no string field \"text\"" "JSONL without the key" -- "$TOKENIZE" "$DIR/x" "$DIR/docs.txt" --tokenizer "$TJ" --json-key text
printf 'ok \xff\xfe bad' >"$DIR/latin.txt"
expect 2 "not valid UTF-8 at byte 3" "invalid UTF-8" -- "$TOKENIZE" "$DIR/x" "$DIR/latin.txt" --tokenizer "$TJ"
expect 2 "--format xml is unknown" "unknown format" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$TJ" --format xml
expect 2 "need --tokenizer" "--json-key without a tokenizer" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --json-key text
expect 2 "cannot read tokenizer file" "missing tokenizer" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$DIR/none.json"
expect 2 "not a tokenizer.json nor a SentencePiece model" "a file that is neither" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$DIR/h.txt"
# tokenizer_files, the one place that decides which files make up a tokenizer (load_tokenizer reads them,
# meshrun-train's token cache key hashes them, meshrun-ckpt export copies them): a directory's tokenizer.json and
# its tokenizer_config.json, not the tokenizer.model beside them; a directory's tokenizer.model alone; a file by
# its content, not its name; a SentencePiece file without the tokenizer_config.json beside it.
files_are() {
  local what=$1 path=$2 want=$3 got
  got=$("$CHECK" files "$path" 2>&1 | tr '\n' ' ')
  [[ $got == "$want " ]] && pass "tokenizer_files: $what" || bad "tokenizer_files: $what: got '$got', wanted '$want'"
}
F=$DIR/files
mkdir -p "$F/both" "$F/spm" "$F/empty"
cp "$TJ" "$T/tokenizer_config.json" "$F/both/" && cp "$DIR/spm.model" "$F/both/tokenizer.model"
cp "$DIR/spm.model" "$F/spm/tokenizer.model" && cp "$T/tokenizer_config.json" "$F/spm/"
cp "$TJ" "$F/both/renamed.txt"
files_are "a directory with all three" "$F/both" "tokenizer.json $F/both/tokenizer.json $F/both/tokenizer_config.json"
files_are "a directory with tokenizer.model" "$F/spm" "sentencepiece $F/spm/tokenizer.model"
files_are "a tokenizer.json under another name" "$F/both/renamed.txt" "tokenizer.json $F/both/renamed.txt $F/both/tokenizer_config.json"
files_are "a .model file beside a tokenizer_config.json" "$F/spm/tokenizer.model" "sentencepiece $F/spm/tokenizer.model"
files_are "the tests' tokenizer.json" "$TJ" "tokenizer.json $TJ $T/tokenizer_config.json"
expect 2 "holds no tokenizer.json nor tokenizer.model" "tokenizer_files: a directory with neither" -- "$CHECK" files "$F/empty"

# Variants of the tokenizer.json: mutate KEY=JSON... into $DIR/v/tokenizer.json (no tokenizer_config.json there).
variant() {
  rm -rf "$DIR/v"; mkdir -p "$DIR/v"
  $PY - "$TJ" "$DIR/v/tokenizer.json" "$@" <<'PYEOF'
import json, sys
t = json.load(open(sys.argv[1], encoding="utf-8"))
for change in sys.argv[3:]:
    path, value = change.split("=", 1)
    node = t
    keys = path.split(".")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(keys[-1]) if isinstance(node, list) else keys[-1]] = json.loads(value)
json.dump(t, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PYEOF
}
V=$DIR/v/tokenizer.json
variant 'normalizer={"type": "Lowercase"}'
expect 2 "normalizer 'Lowercase' is not implemented" "unknown normalizer" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}'
expect 2 "pre-tokenizer 'Whitespace' is not implemented" "unknown pre-tokenizer" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'pre_tokenizer={"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithPrevius", "invert": false}'
expect 2 "pre-tokenizer Split behavior 'MergedWithPrevius' is unknown" "unknown Split behavior" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'pre_tokenizer={"type": "Split", "pattern": {"Regex": "(?<"}, "behavior": "Isolated", "invert": false}'
expect 2 "regular expression does not compile" "bad regex" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'model.type="WordPiece"'
expect 2 "model 'WordPiece' is not implemented" "unknown model" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'decoder={"type": "CTC"}'
expect 2 "decoder 'CTC' is not implemented" "unknown decoder" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'post_processor={"type": "BertProcessing"}'
expect 2 "post-processor 'BertProcessing' is not implemented" "unknown post-processor" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'added_tokens.0.single_word=true'
expect 2 "single_word=true is not implemented" "single_word added token" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'model.merges.0="no_such_token e"'
expect 2 "merge 0 ('no_such_token' 'e') names a token not in the vocabulary" "merge of unknown tokens" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
variant 'added_tokens.0.id=70000'
expect 2 "more than uint16 holds; use --dtype uint32" "ids beyond uint16" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw
expect 0 "wrote" "ids beyond uint16 with --dtype uint32" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V" --format raw --dtype uint32
variant
expect 2 "no EOS token" "Megatron output without tokenizer_config.json's eos_token" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V"
echo '{"eos_token": "<|nope|>"}' >"$DIR/v/tokenizer_config.json"
expect 2 "eos_token '<|nope|>' is not a token of tokenizer.json" "eos_token not in the vocabulary" -- "$TOKENIZE" "$DIR/x" "$DIR/h.txt" --tokenizer "$V"
exit $fail
