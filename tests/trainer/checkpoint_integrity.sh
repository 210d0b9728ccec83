#!/bin/bash
# Checkpoints that cannot be resumed from the wrong state, and saves that fail without losing the run
# (docs/trainer.md, "Checkpoints"; issue 31). Real mpirun, real files, real signals.
#  1. A one-bit flip of manifest.json's step is refused by resume, inspect --verify and export alike (manifest_hash).
#  2. Each cross-check on its own, with the hash recomputed (manifest_edit): step vs directory, consumed_samples,
#     lr_schedule, the shards' own step; pieces that overlap (a block moved by a row) in inspect --verify.
#  Control: the untouched checkpoint verifies and resumes.
#  3. A second run on a checkpoint.dir in use is refused naming the holder; the lock ends with its run.
#  4. A full disk: the failed save's files are removed, training continues (checkpoint.on_error), exit 1 at the end.
#  5. checkpoint.async: the same losses, checkpoints and weights as synchronous saves; resume from its checkpoint.
# usage: checkpoint_integrity.sh MESHRUN_TRAIN MESHRUN_CKPT TEMPLATE MPIRUN MANIFEST_EDIT
set -u
TRAIN=$1 CKPT=$2 TEMPLATE=$3 MPIRUN=$4 EDIT=$5
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-ckpt-integrity-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
write_lcg_corpus "$DIR/corpus.txt"
RUN=("${MPI[@]}" -np 2 "$TRAIN" "$TEMPLATE" --set data.text_cache="$DIR/corpus.bin" --set data.text="$DIR/corpus.txt"
     --set parallel.tp=2 --set training.global_batch_size=8)

expect 0 "checkpoint committed: .*step-4" "a 4-step run saves step-2 and step-4" -- "${RUN[@]}" --set training.steps=4 \
  --set checkpoint.interval=2 --set checkpoint.dir="$DIR/ref"
# fresh CASE: a copy of the reference checkpoint directory
fresh() { rm -rf "$DIR/$1" && cp -a "$DIR/ref" "$DIR/$1"; }
# refused CASE PATTERN WHAT: resume (the same training.steps: resuming is all it does), inspect --verify and export all exit 2 naming PATTERN
refused() {
  local c=$1 pattern=$2 what=$3 path
  path="$DIR/$c/$(cat "$DIR/$c/latest")"
  expect 2 "$pattern" "$what: resume refused" -- "${RUN[@]}" --set training.steps=4 --set checkpoint.dir="$DIR/$c"
  [[ $(grep -c "^meshrun-train" "$DIR/out") -eq 1 ]] || bad "$what: not exactly one line from meshrun-train"
  expect 2 "$pattern" "$what: inspect --verify refused" -- "$CKPT" inspect "$path" --verify
  expect 2 "$pattern" "$what: export refused" -- "$CKPT" export "$path" "$DIR/$c.safetensors"
}

expect 0 "verified:" "control: the untouched checkpoint verifies" -- "$CKPT" inspect "$DIR/ref/step-4" --verify

# 1. One bit: "step": 4 → 5 ('4' is 0x34, '5' is 0x35).
fresh flip
python3 - "$DIR/flip/step-4/manifest.json" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
i = b.index(b'"step": 4') + len(b'"step": ')
b[i] ^= 1
open(p, "wb").write(b)
PY
grep -q '"step": 5' "$DIR/flip/step-4/manifest.json" && pass "the flipped manifest says step 5" || bad "bit flip not applied"
refused flip "manifest.json: the manifest's contents do not match its manifest_hash" "step 4→5 by one bit"

# 2. Each cross-check alone (hash recomputed).
fresh dirname && "$EDIT" "$DIR/dirname/step-4" /step 5
refused dirname "step 5 does not match the directory step-4" "step edited, hash recomputed"
fresh consumed && "$EDIT" "$DIR/consumed/step-4" /step 5 && mv "$DIR/consumed/step-4" "$DIR/consumed/step-5" && echo step-5 >"$DIR/consumed/latest"
refused consumed "consumed_samples = 32 but step 5" "step and directory edited"
fresh lr && "$EDIT" "$DIR/lr/step-4" /step 5 /consumed_samples 40 && mv "$DIR/lr/step-4" "$DIR/lr/step-5" && echo step-5 >"$DIR/lr/latest"
refused lr "lr_schedule (completed_steps 4) does not agree with step 5" "step, directory and consumed_samples edited"
fresh meta && "$EDIT" "$DIR/meta/step-4" /step 5 /consumed_samples 40 /lr_schedule auto && mv "$DIR/meta/step-4" "$DIR/meta/step-5" &&
  echo step-5 >"$DIR/meta/latest"
refused meta "the shard says step 4, rank . but the manifest lists it as step 5" "every manifest field edited"

# Overlap: one piece's block moved down by a row (inside the tensor), hash recomputed.
fresh overlap
read -r f p row <<<"$(python3 - "$DIR/overlap/step-4/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
shapes = {t["name"]: t["shape"] for t in m["tensors"]}
for fi, f in enumerate(m["files"]):
    for pi, p in enumerate(f["pieces"]):
        r0, c0, rows, cols = p["block"]
        if len(shapes[p["tensor"]]) == 2 and r0 + rows < shapes[p["tensor"]][0]:
            print(fi, pi, r0 + 1); sys.exit()
PY
)"
"$EDIT" "$DIR/overlap/step-4" "/files/$f/pieces/$p/block/0" "$row"
refused overlap "is held by" "a piece moved by one row"

# Control: the reference resumes.
expect 0 "resuming from .*step-4" "control: the untouched checkpoint resumes" -- "${RUN[@]}" --set training.steps=4 \
  --set checkpoint.dir="$DIR/ref"

# 3. One writer: a second run on a checkpoint.dir in use is refused at start, naming the holder; the first run,
#    stopped meanwhile (SIGSTOP, so it surely still holds the lock), then finishes and commits.
"${RUN[@]}" --set training.steps=12 --set checkpoint.interval=4 --set checkpoint.dir="$DIR/shared" >"$DIR/a.out" 2>&1 &
apid=$!
for _ in $(seq 1 600); do grep -q "pid" "$DIR/shared/lock" 2>/dev/null && break; sleep 0.1; done
pkill -STOP -P $apid
holder=$(sed 's/.*pid \([0-9]*\).*/\1/' "$DIR/shared/lock")
expect 2 "checkpoint.dir = $DIR/shared is in use by another run (job -, node .*, pid $holder, since" \
  "a second run on the same checkpoint.dir is refused naming the holder's pid" -- "${RUN[@]}" --set training.steps=12 \
  --set checkpoint.dir="$DIR/shared"
pkill -CONT -P $apid
wait $apid && grep -q "checkpoint committed: $DIR/shared/step-12" "$DIR/a.out" && [[ $(cat "$DIR/shared/latest") == step-12 ]] &&
  pass "the first run finishes and commits step-12" || { bad "the first run did not finish"; tail -5 "$DIR/a.out"; }
expect 0 "resuming from $DIR/shared/step-12" "the lock ends with its run: the next run resumes" -- "${RUN[@]}" \
  --set training.steps=12 --set checkpoint.dir="$DIR/shared"

# 5. checkpoint.async: the same losses, checkpoints and final weights as synchronous saves, every save
#    committed; a resume from an asynchronously written checkpoint ends with the same weights.
numbers() { sed -n '/"record":"step"/s/.*"step":\([0-9]*\),"loss":\([^,]*\),"grad_norm":\([^,]*\),"lr":\([^,]*\),.*/\1 \2 \3 \4/p' "$1"; }
for mode in sync async; do
  expect 0 "checkpoint committed: $DIR/$mode/step-8" "8 steps saving every 2 ($mode)" -- "${RUN[@]}" --set training.steps=8 \
    --set checkpoint.interval=2 --set checkpoint.dir="$DIR/$mode" --set checkpoint.async=$([[ $mode == async ]] && echo true || echo false) \
    --metrics "$DIR/$mode.jsonl" --set checkpoint.save="$DIR/$mode.safetensors"
  cp "$DIR/out" "$DIR/$mode.out"
done
[[ $(grep -c "checkpoint committed: .*; async: training waited" "$DIR/async.out") -eq 4 ]] && pass "async: 4 saves committed (steps 2, 4, 6, 8)" ||
  bad "async commits: $(grep -c 'checkpoint committed' "$DIR/async.out")"
# checkpoint.keep = 2: the synchronous save removes before its line; async hands the removal to a thread
# (the line says so), waited for by the next save and at exit: the same two checkpoints remain.
grep -q "latest = step-6; removed step-2" "$DIR/sync.out" && grep -q "latest = step-8; removed step-4" "$DIR/sync.out" &&
  pass "sync: the pruned checkpoints are named as removed" || bad "sync: no 'removed step-2/4'"
grep -q "latest = step-6; removing step-2 in the background; async" "$DIR/async.out" &&
  grep -q "latest = step-8; removing step-4 in the background; async" "$DIR/async.out" &&
  pass "async: the pruned checkpoints are named as being removed in the background" || bad "async: no 'removing step-2/4 in the background'"
[[ $(cd "$DIR/async" && ls -d step-* | tr '\n' ' ') == "step-6 step-8 " && $(cd "$DIR/sync" && ls -d step-* | tr '\n' ' ') == "step-6 step-8 " ]] &&
  pass "async and sync: step-6 and step-8 remain after the runs (the background removal finished)" ||
  bad "left: async $(ls "$DIR/async" | tr '\n' ' '); sync $(ls "$DIR/sync" | tr '\n' ' ')"
[[ -n $(numbers "$DIR/sync.jsonl") && "$(numbers "$DIR/sync.jsonl")" == "$(numbers "$DIR/async.jsonl")" ]] &&
  pass "async: losses, grad norms and lr equal the synchronous run's bit for bit" || bad "async metrics differ"
cmp -s "$DIR/sync.safetensors" "$DIR/async.safetensors" && pass "async: final weights identical" || bad "async final weights differ"
diff -r "$DIR/sync/step-6" "$DIR/async/step-6" >/dev/null && pass "async: checkpoint step-6 is byte-identical to the synchronous one" ||
  bad "async step-6 differs"
echo step-6 >"$DIR/async/latest"
expect 0 "resuming from $DIR/async/step-6" "async: resume from step-6" -- "${RUN[@]}" --set training.steps=8 \
  --set checkpoint.interval=2 --set checkpoint.dir="$DIR/async" --set checkpoint.async=true --set checkpoint.save="$DIR/resumed.safetensors"
cmp -s "$DIR/sync.safetensors" "$DIR/resumed.safetensors" && pass "async: the resumed run ends with the same weights" || bad "resumed weights differ"

# 4. A full disk (a 14 MiB tmpfs; one checkpoint is 9.3 MiB): the save of step 4 fails, its files are removed,
#    step-2 stays latest and training goes on; the final save fails too: exit 1, one line. on_error = "stop"
#    ends the run at the first failure.
mkdir -p "$DIR/small"
if mount -t tmpfs -o size=14m meshrun-test "$DIR/small" 2>/dev/null; then
  trap 'umount "$DIR/small" 2>/dev/null; rm -rf "$DIR"' EXIT
  expect 1 "the final checkpoint is not saved; latest checkpoint: step-2" "disk full: the run ends with exit 1 naming the latest checkpoint" \
    -- "${RUN[@]}" --set training.steps=6 --set checkpoint.interval=2 --set checkpoint.keep=1 --set checkpoint.dir="$DIR/small/a"
  grep -q "checkpoint of step 4 not saved: rank .*No space left on device.*; training continues, latest checkpoint: step-2 (1 of checkpoint.max_failures = 3" "$DIR/out" &&
    pass "the failed save of step 4 is one line and training continues" || bad "no continue line for step 4"
  grep -q "step     6/6" "$DIR/out" && pass "steps 5 and 6 ran after the failure" || bad "the run stopped at the failure"
  [[ $(ls "$DIR/small/a") == "$(printf 'latest\nlock\nmetrics.jsonl\nstep-2')" ]] && pass "no step-*.tmp left: only step-2, latest, the lock and the metrics remain" ||
    bad "left behind: $(ls "$DIR/small/a" | tr '\n' ' ')"
  used=$(df --output=used -k "$DIR/small" | tail -1)
  [[ $used -lt 11000 ]] && pass "the space of the failed saves is given back ($used KiB used)" || bad "$used KiB used after the failures"
  expect 0 "verified:" "step-2 is intact" -- "$CKPT" inspect "$DIR/small/a/step-2" --verify
  rm -rf "$DIR/small/a"
  expect 1 "stopping (checkpoint.on_error = \"stop\", 1 of" "on_error = stop: the first failed save ends the run" \
    -- "${RUN[@]}" --set training.steps=6 --set checkpoint.interval=2 --set checkpoint.keep=1 --set checkpoint.dir="$DIR/small/b" \
    --set checkpoint.on_error=stop
  grep -q "step     5/6" "$DIR/out" && bad "on_error = stop trained past the failure" || pass "no step after the failure"
  # A signal's save that fails: status not-saved (the batch script does not requeue on it), exit 1.
  rm -rf "$DIR/small/b" && fallocate -l 12m "$DIR/small/fill"
  "${RUN[@]}" --set training.steps=400 --set checkpoint.dir="$DIR/small/c" --metrics "$DIR/c.jsonl" >"$DIR/c.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [[ -f $DIR/c.jsonl && $(grep -c '"record":"step"' "$DIR/c.jsonl") -ge 3 ]] && break; sleep 0.1; done
  kill -USR1 "$pid"
  wait "$pid"; rc=$?
  read -r state at sig _ <"$DIR/small/c/status" 2>/dev/null
  [[ $rc -eq 1 && $state == not-saved && $sig == USR1 ]] && pass "a failed save on USR1: exit 1, status not-saved $at USR1" ||
    { bad "failed signal save: exit $rc, status '$(cat "$DIR/small/c/status" 2>/dev/null)'"; tail -3 "$DIR/c.out"; }
  grep -q "stopped after step $at on SIGUSR1 without saving: checkpoint of step $at not saved: .*No space left on device" "$DIR/c.out" &&
    pass "the log says why it was not saved" || bad "no 'without saving' line"
  [[ -z $(ls -d "$DIR/small/c/"step-* 2>/dev/null) ]] && pass "no step-*.tmp left after the failed signal save" || bad "left: $(ls "$DIR/small/c")"
  umount "$DIR/small"
else
  echo "skip the full-disk cases: mounting a tmpfs is not permitted here"
fi

exit $fail
