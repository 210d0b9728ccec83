#!/bin/bash
# Measured pipeline bubble next to the schedule simulator's prediction, for tiny (8 layers) at pp = 2 and 4,
# every schedule; then the context-parallel load balance for tiny at cp = 2 and 4. Not a test; numbers are
# recorded in docs/pipeline.md and docs/trainer.md with the load average of the run.
# usage: bench/pipeline_bench.sh [BUILD_DIR]     (run from the repository root, after scripts/build)
set -eu
BUILD=${1:-build}
MPI=(mpiexec --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DATA=(--set data.text_cache="$BUILD/data/tiny-corpus.bin")
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
for pp in 2 4; do
  "${MPI[@]}" -np "$pp" "$BUILD/bench/meshrun-bench-pipeline" templates/tiny.toml --set model.layers=8 "${DATA[@]}" --steps 5
done
for cp in 2 4; do
  "${MPI[@]}" -np "$cp" "$BUILD/bench/meshrun-bench-cp" templates/tiny.toml --seq 2048,4096,8192 "${DATA[@]}"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
