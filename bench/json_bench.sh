#!/bin/bash
# The streaming JsonWriter against an nlohmann::ordered_json document for the ranks and groups of a
# 131,072-GPU `meshrun plan --format json`: same bytes (check), then time and peak RSS of each, one process each.
# usage: bench/json_bench.sh [BUILD_DIR] [ROUNDS]      (from the repository root; default build, 3)
set -euo pipefail
bin=${1:-build}/bench/meshrun-bench-json
rounds=${2:-3}
"$bin" check
"$bin" writer "$rounds"
"$bin" nlohmann "$rounds"
