#!/bin/bash
# meshrun plan at scale: the dry run's CPU time and peak memory for 16,384 / 131,072 / 1,048,576 GPUs
# (llama3-405b, --format json to /dev/null) and --search --top 5 at 126 / 512 / 1,024 layers, each run RUNS
# times. With a reference binary (e.g. one built from 82f0a24) the two alternate run by run, so both see
# the same load; each row gives the median and the spread (min–max) of CPU seconds (user + sys), wall
# seconds and peak RSS (GNU time's maximum resident set size), and ours ÷ reference of the median CPU.
# usage: bench/plan_bench.sh [REFERENCE_MESHRUN] [RUNS] [MESHRUN]
#        (from the repository root; RUNS default 9, MESHRUN default build/launcher/meshrun)
set -euo pipefail
ref=${1:-}
runs=${2:-9}
bin=${3:-build/launcher/meshrun}
[ -x /usr/bin/time ] || { echo "plan_bench: needs GNU time (/usr/bin/time; Debian: apt-get install time)" >&2; exit 2; }
[ -x "$bin" ] || { echo "plan_bench: $bin is not an executable; build it (ninja -C build meshrun)" >&2; exit 2; }
[ -z "$ref" ] || [ -x "$ref" ] || { echo "plan_bench: reference $ref is not an executable" >&2; exit 2; }
tmp=$(mktemp -d /tmp/meshrun-plan-bench-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# One run: appends "cpu_ms wall_ms rss_kb" to $tmp/<tag>. CPU from bash's `times` (the children of the
# subshell: GNU time and the meshrun it waited for), peak RSS from GNU time.
one() {
  local tag=$1
  shift
  local t0 t1 cpu
  t0=$(date +%s%N)
  cpu=$( { /usr/bin/time -f %M -o "$tmp/rss" "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }; times; } | tail -1)
  t1=$(date +%s%N)
  # "0m0.150s 0m0.020s": user and sys of the children.
  echo "$cpu" | awk -v w=$(( (t1 - t0) / 1000000 )) -v rss="$(tail -1 "$tmp/rss")" '{
      split($1, u, /[ms]/); split($2, s, /[ms]/);
      printf "%d %d %d\n", (u[1] * 60 + u[2] + s[1] * 60 + s[2]) * 1000 + 0.5, w, rss }' >> "$tmp/$tag"
}

# Median and min–max of column $2 of file $1, scaled by $3 (printf format $4).
stat_of() {
  sort -n -k"$2","$2" "$1" | awk -v c="$2" -v k="$3" -v f="$4" '{ v[NR] = $c * k } END {
      printf f " [" f "–" f "]", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR] }'
}
median_of() {
  sort -n -k"$2","$2" "$1" | awk -v c="$2" '{ v[NR] = $c } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

case_no=0
measure() {
  local label=$1
  shift
  case_no=$((case_no + 1))
  : > "$tmp/ours.$case_no"
  [ -z "$ref" ] || : > "$tmp/ref.$case_no"
  for _ in $(seq "$runs"); do
    [ -z "$ref" ] || one "ref.$case_no" "$ref" plan --no-site "$@"
    one "ours.$case_no" "$bin" plan --no-site "$@"
  done
  printf '%-34s ours  cpu %-26s wall %-26s peak %s MB\n' "$label" "$(stat_of "$tmp/ours.$case_no" 1 0.001 %.3f) s" \
    "$(stat_of "$tmp/ours.$case_no" 2 0.001 %.3f) s" "$(stat_of "$tmp/ours.$case_no" 3 0.001 %.0f)"
  if [ -n "$ref" ]; then
    local ratio
    ratio=$(awk -v a="$(median_of "$tmp/ours.$case_no" 1)" -v b="$(median_of "$tmp/ref.$case_no" 1)" \
      'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "n/a" }')
    printf '%-34s ref   cpu %-26s wall %-26s peak %s MB   ours/ref cpu %s\n' "" \
      "$(stat_of "$tmp/ref.$case_no" 1 0.001 %.3f) s" "$(stat_of "$tmp/ref.$case_no" 2 0.001 %.3f) s" \
      "$(stat_of "$tmp/ref.$case_no" 3 0.001 %.0f)" "$ratio"
  fi
}

echo "meshrun plan at scale: $runs runs each${ref:+, interleaved with $ref}; median [min–max]"
echo "ours: $bin ($("$bin" --version 2>/dev/null | head -1))"
[ -z "$ref" ] || echo "ref:  $ref ($("$ref" --version 2>/dev/null | head -1))"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "dry run (--format json, llama3-405b)"
measure "16,384 GPUs (2,048 nodes)" templates/llama3-405b.toml --format json
measure "131,072 GPUs (16,384 nodes)" templates/llama3-405b.toml --format json --nodes 16384 \
  --set cluster.hostlist= --set training.global_batch_size=16384
measure "1,048,576 GPUs (131,072 nodes)" templates/llama3-405b.toml --format json --nodes 131072 \
  --set cluster.hostlist= --set training.global_batch_size=131072
echo
echo "search (--search --top 5, llama3-405b on 16,384 GPUs)"
measure "126 layers" templates/llama3-405b.toml --search --top 5
measure "512 layers" templates/llama3-405b.toml --search --top 5 --set model.layers=512
measure "1,024 layers" templates/llama3-405b.toml --search --top 5 --set model.layers=1024
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
