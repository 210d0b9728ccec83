#!/bin/sh
# `cmake --install` of the plugin directory: the .so lands in <prefix>/lib/slurm (or MESHRUN_SPANK_DIR) and the
# plugstack snippet in <prefix>/share/meshrun/plugstack.conf.d names exactly that file.
# Usage: install_check.sh PLUGIN_BUILD_DIR
set -eu
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
timeout 60 cmake --install "$1" --prefix "$dest/usr" >/dev/null
so=$(find "$dest/usr" -name spank_meshrun.so)
[ -n "$so" ] || { echo "FAIL: spank_meshrun.so not installed"; exit 1; }
case $so in */slurm/spank_meshrun.so) ;; *) echo "FAIL: installed at $so, not in a slurm/ plugin directory"; exit 1 ;; esac
snippet=$dest/usr/share/meshrun/plugstack.conf.d/meshrun.conf
[ -f "$snippet" ] || { echo "FAIL: no $snippet"; exit 1; }
line=$(grep -v '^#' "$snippet")
[ "$line" = "required $so" ] || { echo "FAIL: snippet says '$line', expected 'required $so'"; exit 1; }
echo "ok: $so and $snippet"
