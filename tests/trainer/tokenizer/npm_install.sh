#!/bin/bash
# npm_install.sh SOURCE DEST: the oracle's packages into DEST with npm ci from SOURCE's package-lock.json;
# skipped when DEST already holds that lock file's install. Only the npm registry is contacted.
set -eu
SRC=$1 DEST=$2
mkdir -p "$DEST"
if [[ -d $DEST/node_modules ]] && cmp -s "$SRC/package-lock.json" "$DEST/package-lock.json"; then
  cp "$SRC/encode.mjs" "$DEST/"
  exit 0
fi
command -v npm >/dev/null || { echo "npm_install.sh: npm is missing; install Debian's nodejs and npm (scripts/install-deps)" >&2; exit 1; }
cp "$SRC/package.json" "$SRC/package-lock.json" "$SRC/encode.mjs" "$DEST/"
(cd "$DEST" && npm ci --no-audit --no-fund --loglevel=error)
