#!/bin/sh
# Golden output of `meshrun plan` for templates/tiny.toml (table and JSON).
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
if [ "${3:-}" = "--update" ]; then
  cp "$tmp/plan-tiny.txt" "$tmp/plan-tiny.json" "$dir/"
  echo "updated $dir"
  exit 0
fi
diff -u "$dir/plan-tiny.txt" "$tmp/plan-tiny.txt"
diff -u "$dir/plan-tiny.json" "$tmp/plan-tiny.json"
echo "golden output matches"
