#!/bin/sh
# Golden output of `meshrun plan` for templates/tiny.toml (table and JSON), and of `--schedule` on tiny
# re-laid as a pipeline: ZB-H1 on 4 ranks (table) and interleaved on 2 ranks × 2 chunks (table and JSON).
# usage: plan_golden.sh MESHRUN GOLDEN_DIR [--update]     (run from the repository root)
set -eu
bin=$1
dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A clean environment: no Slurm variables, no site file.
env -i PATH="$PATH" "$bin" plan templates/tiny.toml --no-site > "$tmp/plan-tiny.txt"
env -i PATH="$PATH" "$bin" plan templates/tiny.toml --no-site --format json > "$tmp/raw.json"
python3 -m json.tool --indent 1 "$tmp/raw.json" > "$tmp/plan-tiny.json"
zb="--set parallel.tp=1 --set parallel.pp=4 --set parallel.pipeline_schedule=zb"
inter="--set parallel.pp=2 --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=interleaved"
# shellcheck disable=SC2086  # the option lists split into words on purpose
env -i PATH="$PATH" "$bin" plan templates/tiny.toml --no-site --schedule $zb > "$tmp/plan-tiny-schedule-zb.txt"
# shellcheck disable=SC2086
env -i PATH="$PATH" "$bin" plan templates/tiny.toml --no-site --schedule $inter > "$tmp/plan-tiny-schedule-interleaved.txt"
# shellcheck disable=SC2086
env -i PATH="$PATH" "$bin" plan templates/tiny.toml --no-site --schedule $inter --format json > "$tmp/raw.json"
python3 -m json.tool --indent 1 "$tmp/raw.json" > "$tmp/plan-tiny-schedule-interleaved.json"
files="plan-tiny.txt plan-tiny.json plan-tiny-schedule-zb.txt plan-tiny-schedule-interleaved.txt plan-tiny-schedule-interleaved.json"
if [ "${3:-}" = "--update" ]; then
  for f in $files; do cp "$tmp/$f" "$dir/"; done
  echo "updated $dir"
  exit 0
fi
for f in $files; do diff -u "$dir/$f" "$tmp/$f"; done
echo "golden output matches"
