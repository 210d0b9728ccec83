#!/bin/bash
# Issue 47 through meshrun-train, meshrun-ckpt and meshrun run (items 1, 3, 4, 6), each against its defect:
#  1. data.path is input only: a mistyped data.path with the template's data.text is one line naming it, exit 2,
#     nothing tokenized or written (meshrun-train and meshrun run); data.text is tokenized into data.text_cache;
#     the first lines name the data read;
#  3. ids >= 256 with no data.tokenizer (model.vocab 1024) are refused at start naming data.tokenizer; export of a
#     run with model.vocab > 256 and no tokenizer does not call it byte-level;
#  4. export --tokenizer X.model (SentencePiece) writes its BOS/EOS ids into config.json and generation_config.json
#     and its special pieces into special_tokens_map.json;
#  6. checkpoint.load = a meshrun checkpoint directory (or one step-N) says to resume through checkpoint.dir, to
#     set checkpoint.finetune, or to export first.
# usage: issue47_train.sh MESHRUN_TRAIN MESHRUN_CKPT MESHRUN TEMPLATE MPIRUN
set -u
TRAIN=$1 CKPT=$2 MESHRUN=$3 TEMPLATE=$4 MPIRUN=$5
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-i47-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
export MESHRUN_CACHE_DIR=$DIR/cache  # the template's data.text must not be tokenized anywhere else
two=(--set parallel.dp=1 --no-metrics)  # tp 2 on 2 ranks

# 1. A mistyped data.path: refused, nothing tokenized, no file created at the path or in the cache.
expect 2 "data.path = $DIR/data/nope.bin: no such file" "meshrun-train: a missing data.path is refused" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/data/nope.bin"
one_line "meshrun-train: missing data.path"
grep -q "tokenized" "$DIR/out" && bad "data.text was tokenized for a missing data.path" || pass "nothing tokenized"
[[ ! -e $DIR/data && ! -e $DIR/cache ]] && pass "no file written for a missing data.path" || bad "files written: $(find "$DIR/data" "$DIR/cache" 2>/dev/null)"
expect 2 "data.path = $DIR/data/nope.bin: no such file" "meshrun run: a missing data.path is refused before launching" -- \
  env -u MESHRUN_CACHE_DIR "$MESHRUN" run "$TEMPLATE" --no-site --set data.path="$DIR/data/nope.bin"
one_line "meshrun run: missing data.path"
[[ ! -e $DIR/data ]] && pass "meshrun run wrote nothing at data.path" || bad "meshrun run created $DIR/data"

# data.text_cache: the template's data.text tokenized there; the first lines name the file read.
expect 0 "tokenized /usr/share/common-licenses into $DIR/corpus.bin" "data.text tokenized into data.text_cache" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.text_cache="$DIR/corpus.bin" --set training.steps=1
grep -q "^meshrun-train: data: $DIR/corpus.bin, [0-9]* tokens, uint16" "$DIR/out" && pass "the first lines name the data file, tokens, dtype" ||
  bad "no data line: $(grep 'data' "$DIR/out" | head -3)"
# ... and data.path reads it (data.text of the template not used).
expect 0 "data: $DIR/corpus.bin" "data.path reads the token file as given" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/corpus.bin" --set training.steps=1
grep -q "tokenized" "$DIR/out" && bad "data.path set, yet data.text was tokenized" || pass "data.path set: data.text not tokenized"

# 3. Ids >= 256 with no tokenizer: refused at start, naming data.tokenizer.
python3 - "$DIR/ids.bin" <<'PY'
import struct, sys
ids = [(i * 37) % 1000 for i in range(4096)]  # up to 999, as a 1000-piece tokenizer writes them
open(sys.argv[1], "wb").write(struct.pack("<%dH" % len(ids), *ids))
PY
expect 2 "has id [0-9]* >= 256 but data.tokenizer is not set" "ids >= 256 without data.tokenizer are refused" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/ids.bin" --set model.vocab=1024 --set training.steps=1
one_line "ids >= 256 without data.tokenizer"
# Byte data with a larger vocabulary still trains (ids < 256); its export does not call the run byte-level.
expect 0 "step     2/2" "byte data with model.vocab = 512 trains" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/corpus.bin" --set model.vocab=512 \
  --set training.steps=2 --set checkpoint.dir="$DIR/ck512"
expect 0 "model.vocab = 512 is more than the 256 byte ids" "export of a 512-id run without a tokenizer: not byte-level" -- \
  "$CKPT" export "$DIR/ck512" "$DIR/hf512"
grep -q "byte-level" "$DIR/out" && bad "the export calls a 512-id run byte-level" || pass "no byte-level claim"

# 4. export --tokenizer X.model: BOS/EOS from the SentencePiece model.
if command -v spm_train >/dev/null; then
  head -c 200000 /usr/share/common-licenses/GPL-3 >"$DIR/spm.txt"
  spm_train --input="$DIR/spm.txt" --model_prefix="$DIR/sp" --vocab_size=300 --model_type=bpe --byte_fallback=false \
    --bos_id=1 --eos_id=2 --unk_id=0 --pad_id=3 >/dev/null 2>&1 || bad "spm_train"
  expect 0 "tokenizer files from $DIR/sp.model" "export --tokenizer sp.model" -- \
    "$CKPT" export "$DIR/ck512" "$DIR/hfsp" --tokenizer "$DIR/sp.model"
  python3 - "$DIR/hfsp" <<'PY' && pass "config.json: bos 1, eos 2, pad 3; generation_config.json and special_tokens_map.json agree" || bad "special tokens of the export"
import json, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
g = json.load(open(d + "/generation_config.json"))
m = json.load(open(d + "/special_tokens_map.json"))
want = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
ok = all(c[k] == v for k, v in want.items()) and all(g.get(k) == v for k, v in want.items())
ok = ok and m == {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
print(c.get("bos_token_id"), c.get("eos_token_id"), c.get("pad_token_id"), g, m)
sys.exit(0 if ok else 1)
PY
  python3 -c "import json,sys; c=json.load(open(sys.argv[1])); sys.exit(0 if c['bos_token_id'] is None and c['eos_token_id'] is None else 1)" \
    "$DIR/hf512/config.json" && pass "without a tokenizer the ids stay null" || bad "a tokenizer-less export has special ids"
else
  bad "spm_train is missing (Debian package sentencepiece)"
fi

# 6. checkpoint.load = a meshrun checkpoint directory, or one of its step-N.
step=$(ls -d "$DIR"/ck512/step-* | head -1)
for d in "$DIR/ck512" "$step"; do
  expect 2 "is a meshrun checkpoint directory, not weights to load: to resume it set checkpoint.dir = $DIR/ck512" \
    "checkpoint.load = ${d#$DIR/}: resume through checkpoint.dir, or export" -- \
    "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/corpus.bin" --set model.vocab=512 \
    --set training.steps=1 --set checkpoint.load="$d"
  grep -q "meshrun-ckpt export" "$DIR/out" && pass "the message names meshrun-ckpt export" || bad "no export hint"
  grep -q "set checkpoint.finetune = $d instead of checkpoint.load" "$DIR/out" && pass "the message names checkpoint.finetune" ||
    bad "no checkpoint.finetune hint"
  one_line "checkpoint.load = ${d#$DIR/}"
done
# The exported directory loads (one fix the message names; checkpoint.finetune, the other, is trainer.finetune's).
expect 0 "from the weights in $DIR/hf512" "checkpoint.load = the exported directory loads" -- \
  "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" "${two[@]}" --set data.path="$DIR/corpus.bin" --set model.vocab=512 \
  --set training.steps=1 --set checkpoint.load="$DIR/hf512"
exit $fail
