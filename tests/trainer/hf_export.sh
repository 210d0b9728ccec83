#!/bin/bash
# meshrun-ckpt export PATH OUTDIR (a Hugging Face model directory) and checkpoint.load = DIR, end to end:
#  - a dense (tiny) and an MoE (tiny-moe) checkpoint exported; an independent PyTorch Llama / Mixtral
#    (hf_torch_reference.py, reading only the directory) computes the loss of the exported weights on step 1's
#    batch and it equals the loss meshrun-train reports when it loads the directory, within 1e-5 relative;
#  - loading the directory gives the same step-1 and step-2 loss and grad_norm, bit for bit, as loading the
#    single-file export of the same checkpoint (the form loaded before this existed);
#  - --max-shard-size: shards within the limit, the index lists every tensor once, total_size, and the
#    sharded directory loads (PyTorch and meshrun-train) to the same loss;
#  - negatives: a changed rms_norm_eps makes the PyTorch loss differ and is refused by meshrun-train naming
#    the field, as is a changed rope_theta; rope_scaling, a disagreeing num_key_value_heads, a missing tensor, a bad --max-shard-size and
#    a non-empty OUTDIR are each refused in one line, exit 2;
#  - meshrun-ckpt sample on both checkpoints: --ids, seeds, top-p, bad arguments; on the exported directories the
#    same output as on their checkpoints (greedy and seeded; with the directory's tokenizer.model by default).
# usage: hf_export.sh MESHRUN_TRAIN MESHRUN_TOKENIZE MESHRUN_CKPT MPIRUN TEMPLATES_DIR
set -u
TRAIN=$1 TOKENIZE=$2 CKPT=$3 MPIRUN=$4 TEMPLATES=$5
HERE=$(cd "$(dirname "$0")" && pwd)
# Debian's interpreter: python3-torch is installed for it (scripts/install-deps), not for another python3 on PATH.
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-hf-export-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$HERE/cli_lib.sh"
loss_of() { sed -n "s/.*\"record\":\"step\",\"step\":$2,\"loss\":\([^,]*\),.*/\1/p" "$1"; }
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),.*/\1 \2 \3/p' "$1"; }
"$PY" -c "import torch" 2>/dev/null || { echo "FAIL python3-torch is not installed for $PY (scripts/install-deps)"; exit 1; }

"$TOKENIZE" "$DIR/corpus.bin" /usr/share/common-licenses >/dev/null || { echo "FAIL tokenizer"; exit 1; }
# 2 ranks; step 1's batch unshuffled: sequence i of the 16 is tokens [64 i, 64 i + 64] (hf_torch_reference.py).
run() { local tpl=$1; shift; "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATES/$tpl" --set data.path="$DIR/corpus.bin" "$@"; }

for model in tiny tiny-moe; do
  extra=(); [[ $model == tiny-moe ]] && extra=(--set parallel.ep=2)
  expect 0 "checkpoint committed" "$model: 3 training steps saved to checkpoint.dir" -- run $model.toml "${extra[@]}" \
    --set training.steps=3 --set checkpoint.dir="$DIR/$model-ck" --no-metrics
  expect 0 "no tokenizer files (no --tokenizer" "$model: meshrun-ckpt export CKPT OUTDIR (says it wrote no tokenizer files)" -- \
    "$CKPT" export "$DIR/$model-ck" "$DIR/$model-hf"
  arch=LlamaForCausalLM; [[ $model == tiny-moe ]] && arch=MixtralForCausalLM
  "$PY" - "$DIR/$model-hf" "$arch" <<'PY' && pass "$model: config.json ($arch, sizes, rope, norm, router) and generation_config.json" || bad "$model: config.json"
import json, os, sys
d, arch = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(d, "config.json")))
assert c["architectures"] == [arch], c["architectures"]
want = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "rope_scaling": None, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 64, "torch_dtype": "float32"}
if arch == "MixtralForCausalLM":
    want.update({"intermediate_size": 128, "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.01,
                 "model_type": "mixtral", "sliding_window": None})
else:
    want.update({"intermediate_size": 352, "model_type": "llama", "attention_bias": False, "mlp_bias": False})
bad = {k: (c.get(k), v) for k, v in want.items() if c.get(k, "absent") != v}
assert not bad, bad
assert json.load(open(os.path.join(d, "generation_config.json")))["_from_model_config"] is True
assert sorted(os.listdir(d)) == ["config.json", "generation_config.json", "model.safetensors"], os.listdir(d)
PY
  # meshrun-train's loss of the directory's weights on step 1's batch (the loss is taken before the update).
  expect 0 "from the weights in $DIR/$model-hf" "$model: meshrun-train loads checkpoint.load = OUTDIR" -- run $model.toml \
    "${extra[@]}" --set training.steps=2 --set data.shuffle=false --set checkpoint.load="$DIR/$model-hf" --metrics "$DIR/$model-dir.jsonl"
  L=$(loss_of "$DIR/$model-dir.jsonl" 1)
  if "$PY" "$HERE/hf_torch_reference.py" "$DIR/$model-hf" "$DIR/corpus.bin" --seq-len 64 --batch 16 --expect "$L" >"$DIR/ref.out" 2>&1; then
    pass "$model: PyTorch $arch from the directory alone: $(tail -1 "$DIR/ref.out")"
  else bad "$model: PyTorch loss differs from meshrun's"; sed 's/^/     | /' "$DIR/ref.out" | tail -5; fi
  # The same weights through the single-file export: the same numbers, bit for bit.
  "$CKPT" export "$DIR/$model-ck" "$DIR/$model.safetensors" >/dev/null || bad "$model: single-file export"
  run $model.toml "${extra[@]}" --set training.steps=2 --set data.shuffle=false --set checkpoint.load="$DIR/$model.safetensors" \
    --metrics "$DIR/$model-file.jsonl" >/dev/null 2>&1
  if [[ -n $(numbers "$DIR/$model-dir.jsonl") ]] && diff <(numbers "$DIR/$model-dir.jsonl") <(numbers "$DIR/$model-file.jsonl") >/dev/null; then
    pass "$model: loading OUTDIR = loading OUT.safetensors: steps 1-2 loss and grad_norm bit for bit ($(numbers "$DIR/$model-dir.jsonl" | tr '\n' ' '))"
  else bad "$model: directory and single-file loads differ: $(numbers "$DIR/$model-dir.jsonl" | tr '\n' ' ') vs $(numbers "$DIR/$model-file.jsonl" | tr '\n' ' ')"; fi
done

# Sharding: a 300 KB limit cuts the dense model (3.2 MB) into shards; every shard of more than one tensor keeps
# within it, the index maps every tensor of the single file exactly once, total_size is the tensors' bytes.
expect 0 "weight files" "export --max-shard-size 300KB" -- "$CKPT" export "$DIR/tiny-ck" "$DIR/sharded" --max-shard-size 300KB
"$PY" - "$DIR/sharded" "$DIR/tiny-hf/model.safetensors" <<'PY' >"$DIR/shard.out" 2>&1 && pass "shards: $(cat "$DIR/shard.out")" || { bad "shards"; cat "$DIR/shard.out"; }
import json, os, struct, sys
d, single = sys.argv[1], sys.argv[2]
def header(p):
    with open(p, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    h.pop("__metadata__", None)
    return h
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
wm = index["weight_map"]
files = sorted(set(wm.values()))
n = len(files)
assert n > 1 and files == ["model-%05d-of-%05d.safetensors" % (i + 1, n) for i in range(n)], files
assert sorted(f for f in os.listdir(d) if f.endswith(".safetensors")) == files, os.listdir(d)
want = header(single)
seen = {}
for f in files:
    h = header(os.path.join(d, f))
    size = sum(e["data_offsets"][1] - e["data_offsets"][0] for e in h.values())
    assert len(h) == 1 or size <= 300000, (f, size)
    for name, e in h.items():
        assert name not in seen and wm[name] == f and e["shape"] == want[name]["shape"], name
        seen[name] = f
assert set(seen) == set(wm) == set(want), (set(want) ^ set(seen))
assert index["metadata"]["total_size"] == sum(e["data_offsets"][1] - e["data_offsets"][0] for e in want.values())
print("%d files, every shard of 2+ tensors <= 300000 bytes, the index maps all %d tensors once, total_size %d" % (n, len(seen), index["metadata"]["total_size"]))
PY
run tiny.toml --set training.steps=2 --set data.shuffle=false --set checkpoint.load="$DIR/sharded" --metrics "$DIR/sharded.jsonl" >"$DIR/out" 2>&1
diff <(numbers "$DIR/sharded.jsonl") <(numbers "$DIR/tiny-dir.jsonl") >/dev/null && [[ -n $(numbers "$DIR/sharded.jsonl") ]] \
  && pass "the sharded directory loads to the same steps 1-2 as model.safetensors" || { bad "sharded load differs"; tail -3 "$DIR/out"; }
L=$(loss_of "$DIR/tiny-dir.jsonl" 1)
"$PY" "$HERE/hf_torch_reference.py" "$DIR/sharded" "$DIR/corpus.bin" --seq-len 64 --batch 16 --expect "$L" >"$DIR/ref.out" 2>&1 \
  && pass "PyTorch from the sharded directory: $(tail -1 "$DIR/ref.out")" || bad "PyTorch from the sharded directory: $(tail -1 "$DIR/ref.out")"

# Negatives. A corrupted config field: rms_norm_eps 1e-5 -> 1.0 changes PyTorch's loss, and meshrun-train
# refuses the directory naming the field (so does a changed rope_theta, which 3 steps of training barely use).
edit_config() {  # edit_config SRC DST PYTHON-STATEMENT-ON-c
  cp -r "$1" "$2"
  "$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $3; json.dump(c, open(p,'w'))" "$2/config.json"
}
edit_config "$DIR/tiny-hf" "$DIR/eps" "c['rms_norm_eps'] = 1.0"
"$PY" "$HERE/hf_torch_reference.py" "$DIR/eps" "$DIR/corpus.bin" --seq-len 64 --batch 16 --expect-differ "$L" >"$DIR/ref.out" 2>&1 \
  && pass "rms_norm_eps = 1.0 in config.json: the PyTorch loss moves away from meshrun's: $(tail -1 "$DIR/ref.out")" \
  || bad "a corrupted rms_norm_eps went unnoticed by the loss: $(tail -1 "$DIR/ref.out")"
edit_config "$DIR/tiny-hf" "$DIR/theta" "c['rope_theta'] = 500000.0"
refused() {  # refused DESCRIPTION PATTERN DIR: checkpoint.load = DIR exits 2 with one line holding PATTERN
  expect 2 "$2" "$1" -- run tiny.toml --set training.steps=1 --set checkpoint.load="$3" --no-metrics
  [[ $(grep -c "$2" "$DIR/out") -eq 1 ]] || bad "$1: not one line"
}
refused "rms_norm_eps disagreeing with the template is refused, naming it" \
  "config.json: rms_norm_eps = 1.0 but the template's model.norm_eps = 1e-05" "$DIR/eps"
refused "rope_theta disagreeing with the template is refused, naming it" \
  "config.json: rope_theta = 500000.0 but the template's model.rope_theta = 10000.0" "$DIR/theta"
edit_config "$DIR/tiny-hf" "$DIR/scaling" "c['rope_scaling'] = {'rope_type': 'llama3', 'factor': 8.0}"
refused "rope_scaling is refused (not implemented)" "config.json: rope_scaling = an object: meshrun-train implements plain RoPE" "$DIR/scaling"
edit_config "$DIR/tiny-hf" "$DIR/kv" "c['num_key_value_heads'] = 4"
refused "num_key_value_heads disagreeing with model.kv_heads is refused" \
  "num_key_value_heads = 4 but the template's model.kv_heads = 2" "$DIR/kv"
edit_config "$DIR/tiny-hf" "$DIR/tie" "c['tie_word_embeddings'] = True"
refused "tie_word_embeddings = true is refused" "tie_word_embeddings = true: meshrun-train keeps Llama's untied LM head" "$DIR/tie"
cp -r "$DIR/sharded" "$DIR/missing"
"$PY" -c "import json,sys; p=sys.argv[1]; j=json.load(open(p)); del j['weight_map']['model.layers.2.self_attn.v_proj.weight']; json.dump(j, open(p,'w'))" \
  "$DIR/missing/model.safetensors.index.json"
refused "a tensor missing from the index is refused, naming it" "tensor model.layers.2.self_attn.v_proj.weight is missing" "$DIR/missing"
refused "a template of another model (dense template, MoE directory) is refused" "model_type = \"mixtral\" but the template's model is dense" "$DIR/tiny-moe-hf"
expect 2 "--max-shard-size 5XB is not a size" "a bad --max-shard-size is refused" -- "$CKPT" export "$DIR/tiny-ck" "$DIR/x" --max-shard-size 5XB
expect 2 "exists and is not an empty directory" "export into a non-empty directory is refused" -- "$CKPT" export "$DIR/tiny-ck" "$DIR/sharded"
[[ ! -e $DIR/x && ! -e $DIR/x.tmp ]] && pass "no partial directory left behind" || bad "a partial export directory was left"
expect 2 "applies to the directory form" "--max-shard-size with OUT.safetensors is refused" -- \
  "$CKPT" export "$DIR/tiny-ck" "$DIR/y.safetensors" --max-shard-size 1MB

# meshrun-ckpt sample (issue 28 item 5) on the checkpoints above: greedy output, --ids, seed determinism, top-p
# near 0 = greedy, the MoE model, bad arguments refused in one line (exit 2). The greedy = full-forward argmax
# equality is trainer_generate's (test_generate.cpp).
S=("$CKPT" sample "$DIR/tiny-ck" --prompt "The license ")
expect 0 "ids:" "sample --temperature 0 --ids" -- "${S[@]}" --max-new-tokens 20 --temperature 0 --ids
grep -q "warning" "$DIR/out" && bad "sample within the trained 64 positions warns: $(grep warning "$DIR/out")" ||
  pass "sample within the trained 64 positions (12 + 20) does not warn"
[[ $(grep '^ids:' "$DIR/out" | wc -w) -eq 21 ]] && pass "20 new token ids printed" || bad "ids line: $(grep '^ids:' "$DIR/out")"
grep -q '^The license ' "$DIR/out" && pass "the output starts with the prompt" || bad "no prompt echoed"
expect 0 "warning: the prompt (12 tokens) and --max-new-tokens 60 reach 72 positions, past the 64 the model was trained on (training.seq_len)" \
  "sample past the trained sequence length warns once" -- "${S[@]}" --max-new-tokens 60 --temperature 0
"${S[@]}" --max-new-tokens 30 --temperature 1 --seed 4 --ids >"$DIR/s4a" 2>/dev/null
"${S[@]}" --max-new-tokens 30 --temperature 1 --seed 4 --ids >"$DIR/s4b" 2>/dev/null
"${S[@]}" --max-new-tokens 30 --temperature 1 --seed 5 --ids >"$DIR/s5" 2>/dev/null
[[ -s $DIR/s4a ]] && cmp -s "$DIR/s4a" "$DIR/s4b" && pass "--seed 4 twice: the same 30 tokens" || bad "--seed 4 is not reproducible"
! cmp -s "$DIR/s4a" "$DIR/s5" && pass "--seed 5 draws other tokens than --seed 4" || bad "seeds 4 and 5 gave the same output"
"${S[@]}" --max-new-tokens 30 --temperature 0 --ids >"$DIR/greedy" 2>/dev/null
"${S[@]}" --max-new-tokens 30 --temperature 1 --top-p 1e-9 --seed 4 --ids >"$DIR/nucleus" 2>/dev/null
[[ -s $DIR/greedy ]] && cmp -s "$DIR/greedy" "$DIR/nucleus" && pass "--top-p 1e-9 (the top token alone) = greedy" || bad "top-p 1e-9 differs from greedy"
expect 0 "ids:" "sample from the MoE checkpoint" -- "$CKPT" sample "$DIR/tiny-moe-ck" --prompt "The " --max-new-tokens 10 --seed 2 --ids
# sample PATH = an exported Hugging Face directory (loaded as checkpoint.load = DIR loads it, the model from its
# config.json): greedy and seeded output from OUTDIR equal those from the checkpoint it came from, ids and text
# (dense, MoE, the sharded directory); config.json's rms_norm_eps 1.0 samples other tokens (the comparison can
# fail); a directory asking for what meshrun does not implement is refused in one line.
same_sample() {  # same_sample CKPT OUTDIR SAMPLE-ARGS...: the outputs of both, equal
  local ck=$1 hf=$2; shift 2
  "$CKPT" sample "$DIR/$ck" --prompt "The license " --ids "$@" >"$DIR/from-ck" 2>/dev/null
  "$CKPT" sample "$DIR/$hf" --prompt "The license " --ids "$@" >"$DIR/from-hf" 2>"$DIR/from-hf.err"
  if [[ -s $DIR/from-ck ]] && cmp -s "$DIR/from-ck" "$DIR/from-hf"; then
    pass "sample $hf $* = sample $ck: $(sed -n 's/^ids: //p' "$DIR/from-hf" | wc -w) ids and the text equal"
  else bad "sample $hf $* differs from sample $ck: $(tail -1 "$DIR/from-hf") vs $(tail -1 "$DIR/from-ck"); $(tail -1 "$DIR/from-hf.err")"; fi
}
for pair in "tiny-ck tiny-hf" "tiny-moe-ck tiny-moe-hf" "tiny-ck sharded"; do
  read -r ck hf <<<"$pair"
  same_sample "$ck" "$hf" --max-new-tokens 40 --temperature 0
  same_sample "$ck" "$hf" --max-new-tokens 40 --temperature 1 --seed 4
done
grep -q "sampling from $DIR/sharded on the" "$DIR/from-hf.err" && pass "sample names the directory it samples from" ||
  bad "sample's stderr: $(head -1 "$DIR/from-hf.err")"
"$CKPT" sample "$DIR/eps" --prompt "The license " --ids --max-new-tokens 40 --temperature 0 >"$DIR/from-eps" 2>/dev/null
"$CKPT" sample "$DIR/tiny-ck" --prompt "The license " --ids --max-new-tokens 40 --temperature 0 >"$DIR/from-ck" 2>/dev/null
[[ -s $DIR/from-eps ]] && ! cmp -s "$DIR/from-ck" "$DIR/from-eps" && pass "sample from a directory with rms_norm_eps = 1.0: other tokens" ||
  bad "rms_norm_eps = 1.0 in config.json changed nothing in sample"
for refusal in "scaling:rope_scaling = an object: meshrun-train implements plain RoPE" \
               "tie:tie_word_embeddings = true: meshrun-train keeps Llama's untied LM head" \
               "missing:tensor model.layers.2.self_attn.v_proj.weight is missing"; do
  expect 2 "${refusal#*:}" "sample from directory ${refusal%%:*}: refused" -- "$CKPT" sample "$DIR/${refusal%%:*}" --prompt x
  [[ $(wc -l <"$DIR/out") -eq 1 ]] || bad "sample from directory ${refusal%%:*}: not one line"
done
sample_refused() {  # sample_refused DESCRIPTION PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  expect 2 "$pattern" "$what" -- "$CKPT" sample "$DIR/tiny-ck" "$@"
  [[ $(wc -l <"$DIR/out") -eq 1 ]] || bad "$what: not one line"
}
sample_refused "sample without --prompt" "sample needs --prompt" --max-new-tokens 3
sample_refused "sample --top-p 0" "--top-p must be in (0, 1]" --prompt x --top-p 0
sample_refused "sample --top-p 1.5" "--top-p must be in (0, 1]" --prompt x --top-p 1.5
sample_refused "sample --temperature -1" "--temperature must be a finite number >= 0" --prompt x --temperature -1
sample_refused "sample --max-new-tokens 0" "--max-new-tokens must be at least 1" --prompt x --max-new-tokens 0
sample_refused "sample --seed -3" "--seed -3 is not a number" --prompt x --seed -3
sample_refused "sample --temperature abc" "--temperature abc is not a number" --prompt x --temperature abc
sample_refused "sample with an empty prompt" "the prompt is empty" --prompt ""
sample_refused "sample with an unknown flag" "unexpected argument --beam" --prompt x --beam 4

# --tokenizer: a SentencePiece model of 200 pieces (fits tiny's 256 ids) trained here with Debian's spm_train;
# export ships it as tokenizer.model, sample encodes the prompt and decodes through it; a 300-piece model does
# not fit the vocabulary and is refused by both.
if command -v spm_train >/dev/null; then
  head -c 300000 /usr/share/common-licenses/GPL-3 >"$DIR/spm.txt"
  for n in 200 300; do
    spm_train --input="$DIR/spm.txt" --model_prefix="$DIR/spm$n" --vocab_size=$n --model_type=bpe --byte_fallback=false \
      --bos_id=1 --eos_id=2 --unk_id=0 >/dev/null 2>&1 || bad "spm_train --vocab_size=$n"
  done
  expect 0 "tokenizer.model" "export --tokenizer spm.model ships tokenizer.model" -- \
    "$CKPT" export "$DIR/tiny-ck" "$DIR/tiny-hf-tok" --tokenizer "$DIR/spm200.model"
  cmp -s "$DIR/spm200.model" "$DIR/tiny-hf-tok/tokenizer.model" && pass "the exported tokenizer.model is the given file" ||
    bad "tokenizer.model differs from the given model"
  expect 0 "ids:" "sample --tokenizer spm.model (prompt encoded and output decoded by it)" -- \
    "$CKPT" sample "$DIR/tiny-ck" --prompt "The license " --tokenizer "$DIR/spm200.model" --max-new-tokens 8 --temperature 0 --ids
  ids=$(sed -n 's/^ids: //p' "$DIR/out"); for t in $ids; do [[ $t -lt 200 ]] || bad "sampled id $t is outside the tokenizer's 200"; done
  # The exported directory's tokenizer.model is sample's default there: the same as --tokenizer spm.model on the checkpoint.
  "$CKPT" sample "$DIR/tiny-ck" --prompt "The license " --tokenizer "$DIR/spm200.model" --max-new-tokens 8 --temperature 0 --ids \
    >"$DIR/tok-ck.out" 2>/dev/null
  "$CKPT" sample "$DIR/tiny-hf-tok" --prompt "The license " --max-new-tokens 8 --temperature 0 --ids >"$DIR/tok-hf.out" 2>/dev/null
  [[ -s $DIR/tok-ck.out ]] && cmp -s "$DIR/tok-ck.out" "$DIR/tok-hf.out" &&
    pass "sample OUTDIR (its tokenizer.model by default) = sample CKPT --tokenizer spm.model: $(head -1 "$DIR/tok-hf.out" | cut -c1-40)" ||
    bad "sample from the directory with its tokenizer differs: $(head -1 "$DIR/tok-hf.out") vs $(head -1 "$DIR/tok-ck.out")"
  expect 2 "has 300 tokens but the model's vocabulary is 256" "export --tokenizer with a larger vocabulary is refused" -- \
    "$CKPT" export "$DIR/tiny-ck" "$DIR/tiny-hf-tok300" --tokenizer "$DIR/spm300.model"
  [[ ! -e $DIR/tiny-hf-tok300 ]] && pass "the refused export left no directory" || bad "a refused export left $DIR/tiny-hf-tok300"
  sample_refused "sample --tokenizer with a larger vocabulary" "has 300 tokens but the model's vocabulary is 256" \
    --prompt x --tokenizer "$DIR/spm300.model"
  sample_refused "sample --tokenizer that does not exist" "--tokenizer" --prompt x --tokenizer "$DIR/spm-none.model"

  # data.tokenizer: meshrun-train tokenizes data.text with it (a Megatron dataset in the cache, EOS after each
  # document), the checkpoint records it, and export and sample use it without --tokenizer.
  export MESHRUN_CACHE_DIR=$DIR/cache
  expect 0 "with $DIR/spm200.model into" "data.tokenizer: data.text tokenized with it, 2 steps saved" -- \
    "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATES/tiny.toml" --set data.text="$DIR/spm.txt" --set data.tokenizer="$DIR/spm200.model" \
    --set training.steps=2 --set checkpoint.dir="$DIR/tok-ck" --no-metrics
  ls "$DIR"/cache/text-*.idx >/dev/null 2>&1 && pass "the cache holds a Megatron .bin/.idx" || bad "no .idx in $DIR/cache"
  expect 0 "tokenizer files from $DIR/spm200.model" "export without --tokenizer ships the run's data.tokenizer" -- \
    "$CKPT" export "$DIR/tok-ck" "$DIR/tok-hf"
  cmp -s "$DIR/spm200.model" "$DIR/tok-hf/tokenizer.model" && pass "the run's tokenizer.model is in the export" ||
    bad "the export's tokenizer.model is not the run's"
  expect 0 "ids:" "sample without --tokenizer decodes with the run's data.tokenizer" -- \
    "$CKPT" sample "$DIR/tok-ck" --prompt "The license " --max-new-tokens 6 --temperature 0 --ids
  ids=$(sed -n 's/^ids: //p' "$DIR/out"); for t in $ids; do [[ $t -lt 200 ]] || bad "sampled id $t is outside the tokenizer's 200"; done
  mv "$DIR/spm200.model" "$DIR/spm200.moved"
  expect 2 "which is not there; give --tokenizer" "sample when the run's tokenizer is gone: refused in one line" -- \
    "$CKPT" sample "$DIR/tok-ck" --prompt "x"
  mv "$DIR/spm200.moved" "$DIR/spm200.model"
  expect 2 "has 300 ids but model.vocab = 256" "data.tokenizer larger than model.vocab: refused in one line" -- \
    "${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATES/tiny.toml" --set data.text="$DIR/spm.txt" --set data.tokenizer="$DIR/spm300.model" \
    --set training.steps=1 --no-metrics
  unset MESHRUN_CACHE_DIR
else
  bad "spm_train is missing (Debian package sentencepiece, scripts/install-deps)"
fi
exit $fail
