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

# one_line WHAT: the last command's refusal is one line of meshrun's (the first lines' "data:" aside; mpirun's own
# banner after a non-zero exit is not meshrun's).
one_line() {
  [[ $(grep '^meshrun' "$DIR/out" | grep -vc '^meshrun-train: data: ') -eq 1 ]] && pass "$1: one line" ||
    { bad "$1: not one line"; sed 's/^/     | /' "$DIR/out" | head -5; }
}

# write_lcg_corpus FILE: a deterministic 64 KiB text, words drawn by a 32-bit LCG from a fixed list (the
# golden-loss and bf16 tests' corpus, so their results do not depend on the machine's files).
write_lcg_corpus() {
  python3 - "$1" <<'PY'
import sys
words = ("the of and to in is that for it as with was on be by at this from are or an which not have "
         "pipeline tensor rank gradient expert sequence layer model data token shard batch").split()
x, out, n = 12345, [], 0
while n < 65536:
    x = (1103515245 * x + 12345) & 0xFFFFFFFF
    w = words[(x >> 16) % len(words)]
    out.append(w); n += len(w) + 1
    if (x >> 8) % 13 == 0: out.append(".\n"); n += 2
open(sys.argv[1], "w").write(" ".join(out))
PY
}
