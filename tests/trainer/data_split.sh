#!/bin/bash
# data.split = "train,valid,test" (issue 47 item 12; Megatron-LM's --split) against datasets cut by this script
# with Megatron's own arithmetic (parse_and_normalize_split, convert_split_vector_to_split_matrix, and
# int(round(bookend * sequences)) of _build_megatron_dataset_splits, written out here in Python):
#   - an indexed dataset of 10 sequences split "85,10,5" (8.5 and 9.5 round half to even: sequences 0..7 train,
#     8..9 valid) trains and evaluates bit for bit as data.path = the cut training part with data.valid = the cut
#     validation part (loss, grad_norm, lr, eval_loss of every step, data.shuffle on so that the count of
#     windows matters); control: the whole dataset trains differently;
#   - a raw token file split "9,1" by tokens equals its cut first part;
#   - a blend split "85,10,5" equals the blend of the cut parts with data.valid the blend of the validation parts;
#   - refusals in one line, exit 2: not a number (meshrun-train and meshrun plan), four parts, no training part,
#     with data.valid, eval_interval without a validation part, an empty validation part, a training part
#     shorter than one batch.
# Real mpirun, real files. usage: data_split.sh MESHRUN_TRAIN MESHRUN TEMPLATE MPIRUN
set -u
TRAIN=$1 MESHRUN=$2 TEMPLATE=$3 MPIRUN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-split-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
# tp 2 on 2 ranks, batches of 8 sequences of 64 tokens, shuffled windows, evaluation every 2 of 4 steps.
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set parallel.dp=1 --set training.global_batch_size=8
     --set training.steps=4 --set data.shuffle=true --set data.text=)
EVAL=(--set training.eval_interval=2 --set training.eval_batches=1)
# step, loss, grad_norm, lr and eval_loss of every step record (floats by repr: shortest round-trip, so equal text = equal bits)
numbers() {
  python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("record") == "step":
        print(r["step"], repr(r["loss"]), repr(r["grad_norm"]), repr(r["lr"]), "eval " + repr(r["eval_loss"]) if "eval_loss" in r else "")' "$1"
}
same() {
  numbers "$2" >"$DIR/a" && numbers "$3" >"$DIR/b"
  if [[ $(wc -l <"$DIR/a") -eq 4 ]] && cmp -s "$DIR/a" "$DIR/b" && { [[ -z ${4:-} ]] || grep -q " eval " "$DIR/a"; }; then pass "$1"
  else bad "$1:"; paste "$DIR/a" "$DIR/b" | head -4; fi
}

python3 - "$DIR" <<'PY'
import os, re, struct, sys
d = sys.argv[1]
x = 2024
def lcg():
    global x
    x = (1103515245 * x + 12345) & 0xFFFFFFFF
    return (x >> 16) & 0xFF
def write_indexed(prefix, seqs):  # Megatron's indexed dataset, version 1, uint16 (code 8), one sequence per document
    with open(prefix + ".bin", "wb") as f:
        for s in seqs: f.write(struct.pack("<%dH" % len(s), *s))
    ptrs, p = [], 0
    for s in seqs: ptrs.append(p); p += 2 * len(s)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(seqs), len(seqs) + 1))
        f.write(struct.pack("<%di" % len(seqs), *[len(s) for s in seqs]))
        f.write(struct.pack("<%dq" % len(seqs), *ptrs))
        f.write(struct.pack("<%dq" % (len(seqs) + 1), *range(len(seqs) + 1)))
# Megatron-LM: megatron/core/datasets/blended_megatron_dataset_config.py and blended_megatron_dataset_builder.py.
def split_ranges(split, n):
    v = list(map(float, re.findall(r"[.0-9]+", split)))
    v += [0.0] * (3 - len(v))
    total = sum(v)
    v = [w / total for w in v]
    ends = [0]
    for w in v: ends.append(ends[-1] + w)
    out = []
    for lo, hi in zip(ends[:-1], ends[1:]):
        out.append(None if hi <= lo else (int(round(lo * float(n))), int(round(hi * float(n)))))
    return out
for name, count, base in (("D", 10, 300), ("E", 10, 260)):
    seqs = [[lcg() for _ in range(base + 17 * i)] for i in range(count)]
    write_indexed(os.path.join(d, name), seqs)
    (t0, t1), (v0, v1), _ = split_ranges("85,10,5", count)
    assert (t0, t1, v0, v1) == (0, 8, 8, 10), (t0, t1, v0, v1)  # the ties 8.5 and 9.5 went to even
    write_indexed(os.path.join(d, name + "-train"), seqs[t0:t1])
    write_indexed(os.path.join(d, name + "-valid"), seqs[v0:v1])
raw = [lcg() for _ in range(3001)]
open(os.path.join(d, "raw.bin"), "wb").write(struct.pack("<%dH" % len(raw), *raw))
(a, b), _, _ = split_ranges("9,1", len(raw))
open(os.path.join(d, "raw-train.bin"), "wb").write(struct.pack("<%dH" % (b - a), *raw[a:b]))
PY
[[ -f $DIR/D.idx ]] || { bad "the datasets were not written"; exit 1; }

# An indexed dataset.
expect 0 "data: $DIR/D, a Megatron indexed dataset (dtype from its .idx); the training part of data.split \"85,10,5\": sequences 0..7 of 10 (" \
  "indexed: the first lines name the training part (0..7: 8.5 rounds to 8)" -- \
  "${RUN[@]}" "${EVAL[@]}" --set data.path="$DIR/D" --set data.split=85,10,5 --metrics "$DIR/S.jsonl"
grep -q "validation data: $DIR/D, .*; the validation part of data.split \"85,10,5\": sequences 8..9 of 10" "$DIR/out" &&
  pass "indexed: and the validation part (8..9: 9.5 rounds to 10)" || bad "no validation line: $(grep 'data:' "$DIR/out")"
expect 0 "" "indexed: the cut parts as data.path and data.valid" -- \
  "${RUN[@]}" "${EVAL[@]}" --set data.path="$DIR/D-train" --set data.valid="$DIR/D-valid" --metrics "$DIR/C.jsonl"
same "indexed: data.split = the cut parts, bit for bit (loss, grad_norm, lr, eval_loss)" "$DIR/S.jsonl" "$DIR/C.jsonl" eval
expect 0 "" "control: the whole dataset" -- "${RUN[@]}" --set data.path="$DIR/D" --metrics "$DIR/W.jsonl"
numbers "$DIR/S.jsonl" | sed -n 1p | cut -d' ' -f1-3 >"$DIR/a" && numbers "$DIR/W.jsonl" | sed -n 1p | cut -d' ' -f1-3 >"$DIR/b"
[[ -s $DIR/a ]] && ! cmp -s "$DIR/a" "$DIR/b" && pass "control: the whole dataset's first step differs" ||
  bad "control: the split did not change the first step: $(cat "$DIR/a")"

# A raw token file: split by tokens.
expect 0 "the training part of data.split \"9,1\": tokens 0..2700 of 3001" "raw: the training part named" -- \
  "${RUN[@]}" --set data.path="$DIR/raw.bin" --set data.split=9,1 --metrics "$DIR/RS.jsonl"
expect 0 "" "raw: the cut part as data.path" -- "${RUN[@]}" --set data.path="$DIR/raw-train.bin" --metrics "$DIR/RC.jsonl"
same "raw: data.split = the cut part, bit for bit" "$DIR/RS.jsonl" "$DIR/RC.jsonl"

# A blend: every dataset split the same way; validation blends the validation parts with the same weights.
expect 0 "data: a blend of 2 datasets (data.blend); the training part of data.split \"85,10,5\" of each dataset: sequences 0..7 of 10 (2876 tokens); sequences 0..7 of 10 (" \
  "blend: split" -- "${RUN[@]}" "${EVAL[@]}" --set data.blend="[[0.7, \"$DIR/D\"], [0.3, \"$DIR/E\"]]" \
  --set data.split=85,10,5 --metrics "$DIR/BS.jsonl"
expect 0 "" "blend: the cut parts" -- "${RUN[@]}" "${EVAL[@]}" --set data.blend="[[0.7, \"$DIR/D-train\"], [0.3, \"$DIR/E-train\"]]" \
  --set data.valid="[[0.7, \"$DIR/D-valid\"], [0.3, \"$DIR/E-valid\"]]" --metrics "$DIR/BC.jsonl"
same "blend: data.split = the blend of the cut parts, bit for bit (with eval_loss)" "$DIR/BS.jsonl" "$DIR/BC.jsonl" eval

# Refusals.
refused() {  # refused WHAT PATTERN SETTINGS...
  local what=$1 pattern=$2; shift 2
  expect 2 "$pattern" "$what" -- "${RUN[@]}" --set data.path="$DIR/D" --no-metrics "$@"
  one_line "$what"
}
refused "not a number" 'data.split = "9,x": part 2 "x" is not a number; give one to three comma-separated weights' --set data.split=9,x
expect 2 'data.split = "9,x": part 2 "x" is not a number' "meshrun plan refuses it too" -- \
  "$MESHRUN" plan "$TEMPLATE" --no-site --set data.split=9,x
refused "four parts" 'data.split = "1,2,3,4" has more than three parts' --set data.split=1,2,3,4
refused "no training part" 'data.split = "0,1" gives training nothing' --set data.split=0,1
refused "with data.valid" 'data.split = "9,1" and data.valid both name validation data; keep one' \
  --set data.split=9,1 --set data.valid="$DIR/D-valid" "${EVAL[@]}"
refused "eval_interval without a validation part" 'data.split = "1" gives it no part; give its second (valid) part a weight > 0' \
  --set data.split=1 "${EVAL[@]}"
refused "an empty validation part" 'the validation part of data.split "99,1" is empty (0 of its 10 sequences)' \
  --set data.split=99,1 "${EVAL[@]}"
refused "a training part shorter than a batch" 'the training part of data.split "1,9": sequences 0..0 of 10 (300 tokens), holds fewer tokens than one batch needs (513' \
  --set data.split=1,9
exit $fail
