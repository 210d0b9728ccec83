#!/bin/bash
# Untrusted text echoed by `meshrun`: a TOML string with an escaped \n or ESC, a --set value with ESC and a byte
# that is not UTF-8, an unknown command with an OSC sequence. Each message is exactly one line on stderr, holds
# no control byte and only valid UTF-8, and shows the bytes escaped (\n, \x1b, \xff); "é" and "…" stay as they
# are. exit 2 each. usage: untrusted_text.sh MESHRUN      (run from the repository root)
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect NAME WANT -- ARGS...: exit 2, nothing on stdout, one stderr line, no control byte, valid UTF-8, WANT in it.
expect() {
  local name=$1 want=$2
  shift 3
  env -i PATH="$PATH" "$bin" "$@" > "$tmp/out" 2> "$tmp/err"
  local rc=$? lines ctl utf8=ok
  lines=$(wc -l < "$tmp/err")
  ctl=$(tr -d '\n' < "$tmp/err" | LC_ALL=C grep -c '[[:cntrl:]]')
  iconv -f UTF-8 -t UTF-8 "$tmp/err" > /dev/null 2>&1 || utf8=bad
  if [ "$rc" -ne 2 ] || [ -s "$tmp/out" ] || [ "$lines" -ne 1 ] || [ "$ctl" -ne 0 ] || [ "$utf8" != ok ] ||
     ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL $name: rc=$rc lines=$lines control=$ctl utf8=$utf8 stderr: $(cat -A "$tmp/err" | head -c 600)"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(head -1 "$tmp/err")"
  fi
}

# TOML escapes: the parser turns \n and \u001b into the bytes, the error echoes the value.
printf '[cluster]\nnode_type = "dgx\\nh100"\n' > "$tmp/newline.toml"
printf '[parallel]\norder = "tp-dp\\u001b[2J\\u001b]0;owned\\u0007"\n' > "$tmp/escape.toml"
printf '[cluster]\nnode_type = "caf\xc3\xa9\xe2\x80\xa6\\t"\n' > "$tmp/utf8.toml"

expect "TOML \\n in a string" 'cluster.node_type = "dgx\nh100" is not one of' -- plan --no-site "$tmp/newline.toml"
expect "TOML ESC and BEL in a string" "in order 'tp-dp\\x1b[2J\\x1b]0;owned\\x07'" -- plan --no-site "$tmp/escape.toml"
expect "TOML é and … kept, tab escaped" 'cluster.node_type = "café…\t" is not one of' -- plan --no-site "$tmp/utf8.toml"
expect "--set with ESC and a byte that is not UTF-8" 'cluster.node_type = "x\x1b[31m\xff"' -- \
  plan --no-site templates/tiny.toml --set "cluster.node_type=$(printf 'x\033[31m\377')"
expect "unknown command with an OSC sequence" "unknown command 'x\\x1b]0;t\\x07'" -- "$(printf 'x\033]0;t\007')"
expect "template path with a newline" 'a\nb.toml: cannot read the template' -- plan --no-site "$(printf 'a\nb.toml')"

echo "$failures failures"
[ "$failures" -eq 0 ]
