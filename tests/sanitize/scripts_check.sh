#!/bin/bash
# The robustness scripts refuse bad arguments with one line and exit 2, before building anything
# (docs/robustness.md). usage: scripts_check.sh SOURCE_DIR
set -u
src=$1
fail=0
expect2() {  # expect2 WHAT PATTERN COMMAND...
  local what=$1 pattern=$2
  shift 2
  local err rc
  err=$(timeout 30 "$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -eq 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"$pattern"* ]]; then
    echo "ok: $what"
  else
    echo "FAIL: $what (rc=$rc): $err"
    fail=1
  fi
}
expect2 "scripts/fuzz --time needs a number" "--time needs a number" "$src/scripts/fuzz" --time soon
expect2 "scripts/fuzz refuses an unknown target" "unknown target 'fuzz_nothing'" "$src/scripts/fuzz" fuzz_nothing
expect2 "bench/fuzz.sh needs positive seconds" "SECONDS must be a positive number" "$src/bench/fuzz.sh" 0
exit $fail
