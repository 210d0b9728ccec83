#!/bin/bash
# Wall seconds and max RSS of `meshrun plan` on each hostile template of tests/mesh/robustness_cases.txt
# (targets: < 1 s and < 100 MB each in a release build). Printed, not asserted; tests/mesh/robustness.sh
# checks the refusals themselves.
# usage: bench/robustness.sh [MESHRUN] [CASES]      (from the repository root)
set -euo pipefail
bin=${1:-build/launcher/meshrun}
cases=${2:-tests/mesh/robustness_cases.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

printf '%-40s %4s %9s %10s\n' case exit wall_s max_rss_MB
while IFS='|' read -r name key args bytes; do
  case "$name" in '#'*|'') continue ;; esac
  name=$(echo $name) bytes=${bytes# }
  printf '%b' "$bytes" > "$tmp/case.toml"
  # shellcheck disable=SC2086  # args are words
  /usr/bin/time -f '%e %M' -o "$tmp/time" "$bin" plan --no-site "$tmp/case.toml" $args > /dev/null 2>&1 || true
  read -r wall rss_kb < <(tail -1 "$tmp/time")
  code=$(grep -o 'exited with non-zero status [0-9]*' "$tmp/time" | grep -o '[0-9]*$' || echo 0)
  awk -v n="$name" -v c="$code" -v w="$wall" -v r="$rss_kb" 'BEGIN { printf "%-40s %4s %9.2f %10.1f\n", n, c, w, r / 1024 }'
done < "$cases"
