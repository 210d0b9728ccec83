#!/bin/bash
# Bad input to `meshrun plan`: exit 2, one located line on stderr, nothing on stdout.
# usage: plan_errors.sh MESHRUN      (run from the repository root)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect NAME EXPECTED_STDERR_SUBSTRING -- ARGS...
expect() {
  local name=$1 want=$2
  shift 3
  env -i PATH="$PATH" "$bin" plan --no-site "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l < "$tmp/err")
  if [ "$rc" -ne 2 ] || [ -s "$tmp/out" ] || ! grep -qF -- "$want" "$tmp/err" || [ "$lines" -lt 1 ]; then
    echo "FAIL $name: rc=$rc stdout=$(wc -c < "$tmp/out")B stderr: $(cat "$tmp/err")"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(head -1 "$tmp/err")"
  fi
}

printf '[parallel]\ntp = = 2\n' > "$tmp/syntax.toml"
printf '[parallel]\ntpp = 2\n' > "$tmp/unknown.toml"
printf '[parallel]\ntp = "2"\n' > "$tmp/type.toml"
printf '[parallel]\npp = -4\n' > "$tmp/negative.toml"
printf '[cluster]\nnodes = 2\nnode_type = "dgx-h100"\n[parallel]\ntp = 16\n' > "$tmp/tp16.toml"

expect "syntax error" "$tmp/syntax.toml:2:6: TOML syntax error" -- "$tmp/syntax.toml"
expect "unknown key" "$tmp/unknown.toml:2:1: unknown key 'tpp' in [parallel]; did you mean 'tp'?" -- "$tmp/unknown.toml"
expect "wrong type" "$tmp/type.toml:2:6: parallel.tp must be an integer, got \"2\"; write tp = 2" -- "$tmp/type.toml"
expect "negative size" "$tmp/negative.toml:2:6: parallel.pp = -4 must be at least 1" -- "$tmp/negative.toml"
expect "missing template" "no-such.toml: cannot read the template (no such file)" -- no-such.toml
expect "tp beyond NVLink" "tp=16 is larger than the 8-GPU NVLink domain" -- "$tmp/tp16.toml"
expect "world mismatch" "but the cluster has 4 GPUs" -- templates/tiny.toml --mesh-dp 4
expect "unknown --set key" "--set parallel.tpp=2: unknown key 'parallel.tpp'; did you mean 'parallel.tp'?" -- templates/tiny.toml --set parallel.tpp=2
expect "bad --set type" "parallel.tp must be an integer" -- templates/tiny.toml --set parallel.tp=two
expect "unknown option" "unknown option '--tp'" -- templates/tiny.toml --tp 2
expect "bad format" "unknown format" -- templates/tiny.toml --format yaml
# --schedule needs a valid layout (the schedule rule is part of it) and the template's own layout.
expect "--schedule, invalid layout" 'parallel.virtual_stages=2 needs pipeline_schedule = "interleaved"' -- templates/tiny.toml --schedule --set parallel.virtual_stages=2
expect "--schedule, interleaved without pp" "the interleaved schedule needs a pipeline (pp > 1)" -- templates/tiny.toml --schedule --set parallel.virtual_stages=2 --set parallel.pipeline_schedule=interleaved
expect "--schedule with --search" "--schedule shows the template's own layout and --search ranks other layouts" -- templates/tiny.toml --schedule --search

# The negative control: a valid template passes.
if env -i PATH="$PATH" "$bin" plan --no-site templates/tiny.toml > /dev/null 2>&1; then
  echo "ok   valid template exits 0"
else
  echo "FAIL valid template"
  failures=$((failures + 1))
fi
echo "$failures failures"
[ "$failures" -eq 0 ]
