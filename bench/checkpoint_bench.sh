#!/bin/bash
# Checkpoint save and restore cost (not a test; numbers are recorded in docs/trainer.md): tiny on 4 ranks
# (TP 2 × DP 2, ZeRO-1) and the 100.7M-parameter configuration on 1 rank, both fp32. Each: one training step,
# then the end-of-run save (seconds and bytes as meshrun-train logs them after the commit), then a run that
# resumes from it (load seconds, max over ranks); bytes per rank from the shard files.
# For the 100M model, next to the same bytes moved by the system's tools: the save against `cp` of the shard
# + `sync` of the copy (both start from memory-resident data and end with the bytes on disk), and the load
# from a cold page cache (the shard's pages dropped with posix_fadvise(DONTNEED) after a sync) against a cold
# `dd` of the shard (medians of alternating rounds); then a warm load (the shard read into the page cache
# first: the loader reads those pages from there, and the rest with O_DIRECT). Last, the step stall
# of checkpoint.async against synchronous saves on the mid model.
# Throughputs in MiB/s (2^20 bytes); save MiB/s counts the shard and the manifest.
# usage: bench/checkpoint_bench.sh [BUILD_DIR]     (run from the repository root)
set -eu
BUILD=${1:-build}
TRAIN=$BUILD/trainer/meshrun-train
OUT=$(mktemp -d /tmp/meshrun-ckpt-bench-XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# drop FILES...: write back, then evict the files' pages from the page cache (the next read goes to the disk)
drop() {
  sync
  python3 -c 'import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"
}
now() { date +%s.%N; }
mibs() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1048576 / s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
save_line() { sed -n 's/.*checkpoint committed: .* (\([0-9]* shards, [0-9.]* MiB, [0-9.]* s\)).*/\1/p' "$1"; }
load_s() { sed -n 's/.*loaded in \([0-9.]*\) s.*/\1/p' "$1"; }
run() {  # NAME TEMPLATE ARGS...
  local name=$1 template=$2; shift 2
  ${LAUNCH:-} "$TRAIN" "$template" --set training.steps=1 --set checkpoint.dir="$OUT/$name" "$@" >"$OUT/$name.save.log"
  ${LAUNCH:-} "$TRAIN" "$template" --set training.steps=1 --set checkpoint.dir="$OUT/$name" "$@" >"$OUT/$name.load.log"
  local files
  files=$(stat -c '%s' "$OUT/$name"/step-1/rank-*.safetensors | awk '{ s += $1; if ($1 > m) m = $1 } END { printf "%.2f MiB max per rank", m / 1048576 }')
  printf '%-10s save: %s; %s; restore: %s s\n' "$name" "$(save_line "$OUT/$name.save.log")" "$files" "$(load_s "$OUT/$name.load.log")"
}
LAUNCH="mpirun --oversubscribe --allow-run-as-root -np 4" run tiny templates/tiny.toml

# 100M on 1 rank: ROUNDS (default 5) alternating rounds of (a) a fresh 1-step run and its end-of-run save,
# (b) cp of that shard (first read back into the page cache, like the trainer's state in memory) + sync of
# the copy, (c) a cold dd of the shard (pages dropped), (d) a cold load (a run that only resumes); medians of
# each. Alternating matters on a VM, where a "cold" read can also be served by the host's cache.
set100=(bench/trainer-100m.toml --set training.steps=1 --set parallel.tp=1 --set parallel.dp=1)
shard=$OUT/100m/step-1/rank-00000.safetensors
cold_read() {
  drop "$shard"
  local t0 t1
  t0=$(now); dd if="$shard" of=/dev/null bs=4M status=none; t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
}
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
saves="" cps="" reads="" loads=""
for _ in $(seq "${ROUNDS:-5}"); do
  rm -rf "$OUT/100m"
  sync
  "$TRAIN" "${set100[@]}" --set checkpoint.dir="$OUT/100m" >"$OUT/100m.save.log"
  saves="$saves $(save_line "$OUT/100m.save.log" | sed 's/.*MiB, \([0-9.]*\) s/\1/')"
  cat "$shard" >/dev/null
  sync
  t0=$(now); cp "$shard" "$OUT/copy"; sync "$OUT/copy"; t1=$(now)
  cps="$cps $(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')"
  rm -f "$OUT/copy"
  reads="$reads $(cold_read)"
  drop "$shard" "$OUT/100m/step-1/manifest.json"
  "$TRAIN" "${set100[@]}" --set checkpoint.dir="$OUT/100m" >"$OUT/100m.load.log"
  loads="$loads $(load_s "$OUT/100m.load.log")"
done
bytes=$(stat -c %s "$shard")
total=$(( bytes + $(stat -c %s "$OUT/100m/step-1/manifest.json") ))
save_s=$(median <<<"$saves") cp_s=$(median <<<"$cps") cat_s=$(median <<<"$reads") cold_s=$(median <<<"$loads")
cat "$shard" >/dev/null  # the cold loads read with O_DIRECT and leave nothing in the page cache
"$TRAIN" "${set100[@]}" --set checkpoint.dir="$OUT/100m" >"$OUT/100m.load2.log"
warm_s=$(load_s "$OUT/100m.load2.log")
staging=$(sed -n 's/.*checkpoint staging buffer: \([0-9.]* MiB\) on rank 0, allocated and touched in \([0-9.]* s\).*/\1 in \2/p' "$OUT/100m.save.log")
save_r=$(mibs "$total" "$save_s") cp_r=$(mibs "$bytes" "$cp_s") cold_r=$(mibs "$bytes" "$cold_s") cat_r=$(mibs "$bytes" "$cat_s")
printf '%-10s %.2f MiB shard; staging buffer at start-up: %s\n' 100m "$(awk -v b="$bytes" 'BEGIN { print b / 1048576 }')" "$staging"
printf '           save       %6s MiB/s (%.3f s) | cp + sync of the shard %6s MiB/s (%.3f s) | save / (cp + sync) = %s   (medians; saves:%s s; cp:%s s)\n' \
  "$save_r" "$save_s" "$cp_r" "$cp_s" "$(ratio "$save_r" "$cp_r")" "$saves" "$cps"
printf '           cold load  %6s MiB/s (%.3f s) | cold read of the shard %6s MiB/s (%.3f s) | load / cold read  = %s   (medians; loads:%s s; reads:%s s)\n' \
  "$cold_r" "$cold_s" "$cat_r" "$cat_s" "$(ratio "$cold_r" "$cat_r")" "$loads" "$reads"
printf '           warm load  %6s MiB/s (%s s)\n' "$(mibs "$bytes" "$warm_s")" "$warm_s"

# Async save, mid model (bench/trainer-mid.toml, 1 rank, 16 steps saving every 2): what the steps waited for
# each save, synchronous (the save's own time) against checkpoint.async (the host copy and the commit), and
# each run's wall time (the async writes share the cores with training).
for mode in false true; do
  rm -rf "$OUT/mid-$mode"
  t0=$(now)
  "$TRAIN" bench/trainer-mid.toml --set training.steps=16 --set checkpoint.interval=2 --set checkpoint.dir="$OUT/mid-$mode" \
    --set checkpoint.async=$mode >"$OUT/mid-$mode.log"
  t1=$(now)
  eval "wall_$mode=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')"
done
sync_waits=$(sed -n 's/.*checkpoint committed: .*MiB, \([0-9.]*\) s).*/\1/p' "$OUT/mid-false.log" | tr '\n' ' ')
async_waits=$(sed -n 's/.*async: training waited \([0-9.]*\) s of it.*/\1/p' "$OUT/mid-true.log" | tr '\n' ' ')
# The periodic saves (steps 2, 4, ..., 14: seven, so that one slow save does not move the median); the final
# save is waited for in both modes.
sync_m=$(echo "$sync_waits" | awk '{ $NF = ""; print }' | median) async_m=$(echo "$async_waits" | awk '{ $NF = ""; print }' | median)
printf 'mid async  the steps waited %.3f s per periodic save (async) against %.3f s (synchronous): %s   (saves, sync: %s s; async: %s s)\n' \
  "$async_m" "$sync_m" "$(ratio "$async_m" "$sync_m")" "$sync_waits" "$async_waits"
printf '           run wall time (16 steps, 8 saves): synchronous %s s, async %s s\n' "$wall_false" "$wall_true"
