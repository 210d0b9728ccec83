#!/bin/bash
# Issue 47's messages of `meshrun` (items 1, 7, 8, 9, 10), each against the defect it fixes:
#  1. a data.path that does not exist is refused by plan, run --dry-run and sbatch --dry-run (one line naming it,
#     exit 2; data.path is input only, never filled from the template's data.text);
#  7. every unknown key of a template is reported, one file:line:col line each, in the file's order;
#  8. parallel.order = tp-dp-pp names cp as missing (ep may be left out), not "cp, ep";
#  9. an unknown --set key gets the suggestion a template's key gets (another trainer's name, the section's keys);
# 10. `meshrun plot a/metrics.jsonl b/metrics.jsonl` labels the runs by their directories, or by --label.
# usage: issue47_cli.sh MESHRUN      (run from the repository root)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; [ -s "$tmp/err" ] && sed 's/^/     | /' "$tmp/err" | head -8; failures=$((failures + 1)); }
# m ARGS...: meshrun in a clean environment; stdout in $tmp/out, stderr in $tmp/err, status in $rc.
m() { env -i PATH="$PATH" HOME="$tmp" "$bin" "$@" >"$tmp/out" 2>"$tmp/err"; rc=$?; }
lines() { wc -l <"$tmp/err"; }
has() { grep -qF -- "$1" "$tmp/err"; }

# 1. data.path is input only.
for cmd in "plan" "run --dry-run" "sbatch --dry-run --plugin no"; do
  # shellcheck disable=SC2086
  m $cmd --no-site templates/tiny.toml --set data.path="$tmp/data/nope.bin"
  if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "data.path = $tmp/data/nope.bin: no such file" &&
     [ ! -e "$tmp/data" ]; then ok "$cmd: a missing data.path is one line, exit 2"
  else bad "$cmd: a missing data.path: rc=$rc lines=$(lines)"; fi
done
m plan --no-site templates/tiny.toml --set data.text="$tmp/none.txt"
[ "$rc" -eq 2 ] && has "data.text input $tmp/none.txt: no such file" && ok "plan: a missing data.text input" ||
  bad "plan: a missing data.text input: rc=$rc"
printf 'x' >"$tmp/corpus.bin"
m plan --no-site templates/tiny.toml --set data.path="$tmp/corpus.bin"
[ "$rc" -eq 0 ] && ok "plan: an existing data.path passes" || bad "plan: an existing data.path: rc=$rc"

# 7. Every unknown key, one located line each.
printf '[model]\nlayer = 4\n[training]\nstep = 60\nlearning_rate = 1e-3\n[parallel]\ntp = 2\n' >"$tmp/keys.toml"
m plan --no-site "$tmp/keys.toml"
want1="meshrun plan: $tmp/keys.toml:2:1: unknown key 'layer' in [model]; did you mean 'layers'?"
want2="meshrun plan: $tmp/keys.toml:4:1: unknown key 'step' in [training]; did you mean 'steps'?"
want3="meshrun plan: $tmp/keys.toml:5:1: unknown key 'learning_rate' in [training]; did you mean 'lr'?"
if [ "$rc" -eq 2 ] && [ "$(lines)" -eq 3 ] && [ "$(sed -n 1p "$tmp/err")" = "$want1" ] &&
   [ "$(sed -n 2p "$tmp/err")" = "$want2" ] && [ "$(sed -n 3p "$tmp/err")" = "$want3" ] && [ ! -s "$tmp/out" ]; then
  ok "three unknown keys: three located lines in the file's order"
else bad "three unknown keys: rc=$rc lines=$(lines)"; fi
m run --dry-run --no-site "$tmp/keys.toml"
[ "$rc" -eq 2 ] && [ "$(lines)" -eq 3 ] && has "meshrun run: $tmp/keys.toml:4:1: unknown key 'step'" &&
  ok "run --dry-run: the same three lines" || bad "run --dry-run: rc=$rc lines=$(lines)"

# 8. The order message names what is missing.
m plan --no-site templates/tiny.toml --set parallel.order=tp-dp-pp
if [ "$rc" -eq 2 ] && has "order 'tp-dp-pp' does not name cp;" && ! has "cp, ep" && has "ep may be left out"; then
  ok "order tp-dp-pp: cp is named as missing, ep is not"
else bad "order tp-dp-pp: rc=$rc"; fi
m plan --no-site templates/tiny.toml --set parallel.order=tp-cp-ep-dp
[ "$rc" -eq 2 ] && has "does not name pp;" && ok "order tp-cp-ep-dp: pp is missing" || bad "order tp-cp-ep-dp: rc=$rc"
m plan --no-site templates/tiny.toml --set parallel.order=tp-cp-dp-pp
[ "$rc" -eq 0 ] && ok "order tp-cp-dp-pp (ep left out) passes" || bad "order tp-cp-dp-pp: rc=$rc"

# 9. Did-you-mean for --set keys.
m plan --no-site templates/tiny.toml --set training.learning_rate=1e-3
[ "$rc" -eq 2 ] && has "--set training.learning_rate=1e-3: unknown key 'training.learning_rate'; did you mean 'training.lr'?" &&
  ok "--set training.learning_rate: did you mean training.lr" || bad "--set training.learning_rate: rc=$rc"
m plan --no-site templates/tiny.toml --set model.layer=4
[ "$rc" -eq 2 ] && has "unknown key 'model.layer'; did you mean 'model.layers'?" && ok "--set model.layer: did you mean model.layers" ||
  bad "--set model.layer: rc=$rc"
m plan --no-site templates/tiny.toml --set model.tp=2
[ "$rc" -eq 2 ] && has "unknown key 'model.tp'; did you mean 'parallel.tp'?" && ok "--set model.tp: did you mean parallel.tp" ||
  bad "--set model.tp: rc=$rc"
m plan --no-site templates/tiny.toml --set training.zzzzzz=1
[ "$rc" -eq 2 ] && has "unknown key 'training.zzzzzz'; valid keys: seq_len" && ok "--set training.zzzzzz: the section's keys" ||
  bad "--set training.zzzzzz: rc=$rc"
m plan --no-site templates/tiny.toml --set traning.steps=4
[ "$rc" -eq 2 ] && has "did you mean 'training.steps'?" && ok "--set traning.steps: did you mean training.steps" ||
  bad "--set traning.steps: rc=$rc"

# 10. Plot labels: two files of the same name in two directories, and --label.
mkdir -p "$tmp/ck1" "$tmp/ck2"
for d in ck1 ck2; do
  printf '{"record":"run","schema":1,"start_step":0,"model":"tiny"}\n{"record":"step","step":1,"loss":5.5}\n{"record":"step","step":2,"loss":5.0}\n' \
    >"$tmp/$d/metrics.jsonl"
done
m plot "$tmp/ck1/metrics.jsonl" "$tmp/ck2/metrics.jsonl" -o "$tmp/p.svg"
if [ "$rc" -eq 0 ] && grep -qF "ck1/metrics.jsonl" "$tmp/p.svg" && grep -qF "ck2/metrics.jsonl" "$tmp/p.svg"; then
  ok "plot: the runs are labelled ck1/metrics.jsonl and ck2/metrics.jsonl"
else bad "plot: labels: rc=$rc $(grep -o '[a-z0-9/]*metrics.jsonl' "$tmp/p.svg" 2>/dev/null | sort -u | tr '\n' ' ')"; fi
m plot "$tmp/ck1/metrics.jsonl" "$tmp/ck2/metrics.jsonl" -o "$tmp/q.svg" --label "lr 3e-3" --label "lr 1e-3"
[ "$rc" -eq 0 ] && grep -qF "lr 3e-3" "$tmp/q.svg" && grep -qF "lr 1e-3" "$tmp/q.svg" && ok "plot --label names the runs" ||
  bad "plot --label: rc=$rc"
m plot "$tmp/ck1/metrics.jsonl" "$tmp/ck2/metrics.jsonl" -o "$tmp/r.svg" --label one
[ "$rc" -eq 2 ] && [ "$(lines)" -eq 1 ] && has "1 --label for 2 metrics files" && ok "plot: a --label count that differs is refused" ||
  bad "plot: --label count: rc=$rc"

echo "$failures failures"
[ "$failures" -eq 0 ]
