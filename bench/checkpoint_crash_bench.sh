#!/bin/bash
# Crash-safety benchmark: SIGKILL at N (default 100) points inside a checkpoint save drawn from a seed, each
# followed by a resume; prints "N kills, K corrupt resumes" (docs/trainer.md, "Checkpoints").
# usage: bench/checkpoint_crash_bench.sh [BUILD_DIR=build] [N=100] [SEED=1] [ASYNC=0]   (ASYNC=1: checkpoint.async)
set -u
cd "$(dirname "$0")/.."
B=${1:-build} N=${2:-100} SEED=${3:-1} ASYNC=${4:-0}
exec tests/trainer/checkpoint_crash.sh "$B/trainer/meshrun-train" "$B/trainer/meshrun-tokenize" templates/tiny.toml \
  "$(command -v mpiexec)" "$N" "$SEED" "$ASYNC"
