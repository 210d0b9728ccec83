#!/bin/bash
# The Debian packages (scripts/package = cpack -G DEB): built into a temporary directory, unpacked with
# dpkg-deb -x into a temporary root (the machine's Slurm is left alone), their contents and dependencies
# checked. Usage: package_check.sh BUILD_DIR
set -u
build=$1
fail=0
bad() { echo "FAIL: $*"; fail=1; }
command -v cpack >/dev/null && command -v dpkg-deb >/dev/null || { echo "SKIP: cpack or dpkg-deb missing"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
(ulimit -v 4000000; timeout 240 cpack --config "$build/CPackConfig.cmake" -G DEB -B "$out" >"$out/cpack.log" 2>&1) ||
  { cat "$out/cpack.log"; echo "FAIL: cpack"; exit 1; }
cli=$(ls "$out"/meshrun_*.deb 2>/dev/null) plugin=$(ls "$out"/meshrun-slurm-plugin_*.deb 2>/dev/null)
[ -f "$cli" ] || { echo "FAIL: no meshrun_*.deb in $(ls "$out")"; exit 1; }
[ -f "$plugin" ] || { echo "FAIL: no meshrun-slurm-plugin_*.deb"; exit 1; }
mkdir "$out/cli" "$out/plugin"
dpkg-deb -x "$cli" "$out/cli" && dpkg-deb -x "$plugin" "$out/plugin" || { echo "FAIL: dpkg-deb -x"; exit 1; }
for f in usr/bin/meshrun usr/bin/meshrun-preflight usr/bin/meshrun-bench-device usr/bin/meshrun-train usr/bin/meshrun-tokenize usr/share/man/man1/meshrun.1 \
         usr/share/bash-completion/completions/meshrun usr/share/meshrun/templates/tiny.toml \
         usr/share/meshrun/templates/llama3-405b.toml; do
  [ -f "$out/cli/$f" ] || bad "meshrun package lacks /$f"
done
[ -e "$out/cli/usr/lib/slurm/spank_meshrun.so" ] && bad "the CLI package carries the plugin"
so=$out/plugin/usr/lib/slurm/spank_meshrun.so
[ -f "$so" ] || bad "plugin package lacks /usr/lib/slurm/spank_meshrun.so"
[ "$(find "$out/plugin" -type f | wc -l)" = 2 ] || bad "plugin package holds more than the .so and the snippet: $(find "$out/plugin" -type f)"
snippet=$(grep -v '^#' "$out/plugin/usr/share/meshrun/plugstack.conf.d/meshrun.conf" 2>/dev/null)
[ "$snippet" = "required /usr/lib/slurm/spank_meshrun.so" ] || bad "snippet line is '$snippet'"
# The unpacked binary works.
"$out/cli/usr/bin/meshrun" plan "$out/cli/usr/share/meshrun/templates/tiny.toml" --no-site >/dev/null ||
  bad "the packaged meshrun cannot plan the packaged tiny template"
# Dependencies: the shared libraries, and the exact Slurm release of the headers the plugin was built with.
deps=$(dpkg-deb -f "$plugin" Depends)
want=$(dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null)
if [ -n "$want" ]; then
  echo "$deps" | grep -qF "slurm-client (= $want) | slurmd (= $want)" || bad "plugin Depends lacks the Slurm pin (= $want): $deps"
fi
echo "$deps" | grep -q 'libhwloc15' || bad "plugin Depends lacks libhwloc15: $deps"
echo "$deps" | grep -q 'libtomlplusplus3' || bad "plugin Depends lacks libtomlplusplus3: $deps"
cdeps=$(dpkg-deb -f "$cli" Depends)
echo "$cdeps" | grep -q 'libhwloc15' || bad "meshrun Depends lacks libhwloc15: $cdeps"
echo "$cdeps" | grep -q 'slurm' && bad "the CLI package depends on Slurm: $cdeps"
echo "packages: $(basename "$cli") ($(dpkg-deb -f "$cli" Depends)); $(basename "$plugin") ($deps)"
exit $fail
