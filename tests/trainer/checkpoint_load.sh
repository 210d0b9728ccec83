#!/bin/bash
# Every way a load places the state (trainer/src/checkpoint/save_load.cpp), each resumed from step 2 of a
# 4-step run and checked bit for bit against that run's steps 3 and 4 (loss, grad_norm, lr):
#   ZeRO-0:  parameters and moments read straight into the store (CPU backend memory);
#   ZeRO-1:  parameters in place, the moments' shard staged and uploaded;
#   ZeRO-3:  everything staged;
#   bf16:    the fp32 master staged and rounded into the bf16 weights, the moments in place;
#   tmpfs:   a checkpoint.dir on tmpfs, which refuses O_DIRECT before Linux 6.6: the read-ahead then reads
#            through the page cache (the script says which happened).
# Real mpirun, real files. usage: checkpoint_load.sh MESHRUN_TRAIN TEMPLATE MPIRUN
set -u
TRAIN=$1 TEMPLATE=$2 MPIRUN=$3
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-ckpt-load-XXXXXX)
trap 'umount "$DIR/tmpfs" 2>/dev/null; rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set data.text_cache="$DIR/corpus.bin" --set data.text="$DIR/corpus.txt"
     --set training.global_batch_size=8 --set training.steps=4 --set checkpoint.interval=2)
# step, loss, grad_norm, lr of every metrics line (shortest round-trip text: equal text = equal bits)
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),"lr":\([^,]*\),.*/\1 \2 \3 \4/p' "$1"; }

# resumed_equal NAME CKPT_DIR SETTINGS...: the 4-step reference, then its step-4 removed and a resume from step-2.
resumed_equal() {
  local name=$1 ck=$2; shift 2
  expect 0 "latest = step-4" "$name: 4 steps, saving steps 2 and 4" -- "${RUN[@]}" "$@" --set checkpoint.dir="$ck" \
    --metrics "$DIR/$name.ref.jsonl"
  rm -rf "$ck/step-4" && echo step-2 >"$ck/latest"
  expect 0 "resuming from $ck/step-2: step 2" "$name: resumes from step-2" -- "${RUN[@]}" "$@" --set checkpoint.dir="$ck" \
    --metrics "$DIR/$name.res.jsonl"
  grep -q "finished steps 3\.\.4 (2 in this run) .*; latest checkpoint step-4$" "$DIR/out" ||
    bad "$name: the resumed run's summary does not say steps 3..4 and step-4: $(grep finished "$DIR/out")"
  numbers "$DIR/$name.ref.jsonl" | awk '$1 > 2' >"$DIR/$name.want"
  numbers "$DIR/$name.res.jsonl" >"$DIR/$name.got"
  if [[ $(wc -l <"$DIR/$name.want") -eq 2 ]] && cmp -s "$DIR/$name.want" "$DIR/$name.got"; then
    pass "$name: steps 3 and 4 after the load == the uninterrupted run's, bit for bit"
  else
    bad "$name: steps after the load differ:"; paste "$DIR/$name.want" "$DIR/$name.got" | head -4
  fi
}

resumed_equal zero0 "$DIR/zero0" --set parallel.tp=2 --set parallel.zero_stage=0
resumed_equal zero1 "$DIR/zero1" --set parallel.tp=1 --set parallel.zero_stage=1
resumed_equal zero3 "$DIR/zero3" --set parallel.tp=1 --set parallel.zero_stage=3
resumed_equal bf16 "$DIR/bf16" --set parallel.tp=2 --set parallel.zero_stage=0 --set training.dtype=bf16

# The negative control: a resume that does not load the same state (its step-2 from another seed's run)
# must differ, or the comparison above proves nothing.
expect 0 "latest = step-4" "control: a run with another seed" -- "${RUN[@]}" --set parallel.tp=2 --set parallel.zero_stage=0 \
  --set training.seed=7 --set checkpoint.dir="$DIR/other"
rm -rf "$DIR/zero0/step-2" && cp -a "$DIR/other/step-2" "$DIR/zero0/step-2"
expect 0 "resuming from" "control: resume from the other run's step-2" -- "${RUN[@]}" --set parallel.tp=2 --set parallel.zero_stage=0 \
  --set checkpoint.dir="$DIR/zero0" --metrics "$DIR/control.jsonl"
numbers "$DIR/control.jsonl" | cmp -s - "$DIR/zero0.want" && bad "control: another state's resume matched the reference" ||
  pass "control: another state's resume differs from the reference"

mkdir -p "$DIR/tmpfs"
if mount -t tmpfs -o size=64m meshrun-test "$DIR/tmpfs" 2>/dev/null; then
  if python3 -c 'import os, sys; os.close(os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY | os.O_DIRECT))' "$DIR/tmpfs/probe" 2>/dev/null; then
    echo "note: this kernel's tmpfs accepts O_DIRECT (Linux >= 6.6), so this case reads with O_DIRECT too; a refusal is not exercised here"
  fi
  resumed_equal tmpfs "$DIR/tmpfs/ck" --set parallel.tp=2 --set parallel.zero_stage=0
  umount "$DIR/tmpfs"
else
  echo "skip the tmpfs case: mounting a tmpfs is not permitted here"
fi
exit $fail
