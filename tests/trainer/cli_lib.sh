# Shared by the trainer's CLI test scripts (sourced): pass/bad bookkeeping and `expect`.
# The sourcing script sets DIR (a scratch directory) and reports $fail at its end.
fail=0
pass() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# expect CODE PATTERN DESCRIPTION -- command...: exit status CODE and (if PATTERN is not empty) PATTERN in the output.
expect() {
  local code=$1 pattern=$2 what=$3; shift 4
  "$@" >"$DIR/out" 2>&1; local rc=$?
  if [[ $rc -ne $code ]]; then bad "$what: exit $rc, expected $code"; sed 's/^/     | /' "$DIR/out" | tail -8; return; fi
  if [[ -n $pattern ]] && ! grep -q -- "$pattern" "$DIR/out"; then bad "$what: output lacks '$pattern'"; sed 's/^/     | /' "$DIR/out" | tail -8; return; fi
  pass "$what"
}
