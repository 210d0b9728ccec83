#!/bin/bash
# One table of bad configurations (tests/common/bad_configs.py: layout, model and bundled-trainer rules)
# through five consumers: meshrun plan, meshrun sbatch --dry-run, meshrun run --dry-run, meshrun exec --
# meshrun-train, and meshrun-train under mpirun. Each must refuse every row with exit 2 and the row's own line
# (the sixth consumer, the SPANK plugin, runs the same table in tests/slurm/checks.sh bad_configs_plugin). Before
# the bundled trainer's rules moved to mesh (validate_trainer), plan and sbatch accepted what the trainer refused.
# usage: bad_configs.sh   (MESHRUN, TRAIN, MPIRUN, SRC from ctest)
set -u
DIR=$(mktemp -d /tmp/meshrun-bad-configs-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
fail=0
pass() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
python3 "$SRC/tests/common/bad_configs.py" "$SRC/templates" "$DIR" >"$DIR/table" || { echo "FAIL the table"; exit 1; }
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
# refused NAME LINE CONSUMER -- COMMAND...: exit 2 and LINE on stderr, nothing run
refused() {
  local name=$1 line=$2 who=$3; shift 4
  "$@" >"$DIR/out" 2>"$DIR/err" </dev/null; local rc=$?
  if [[ $rc -eq 2 ]] && grep -qF -- "$line" "$DIR/err"; then return 0; fi
  bad "$name: $who: exit $rc, stderr: $(head -3 "$DIR/err")"
  return 1
}
rows=0
while IFS=$'\t' read -r name line; do
  t=$DIR/$name.toml
  ok=1
  refused "$name" "$line" "plan" -- "$MESHRUN" plan "$t" --no-site || ok=0
  refused "$name" "$line" "sbatch --dry-run" -- "$MESHRUN" sbatch "$t" --no-site --plugin no --dry-run || ok=0
  refused "$name" "$line" "run --dry-run" -- "$MESHRUN" run "$t" --no-site --dry-run || ok=0
  refused "$name" "$line" "exec -- meshrun-train" -- "$MESHRUN" exec --template "$t" --no-site --rank 0 --world-size 4 \
    --no-bind -- "$TRAIN" "$t" || ok=0
  # mpirun's own lines follow the trainer's: the trainer's line is what must match (rank 0 prints it).
  "${MPI[@]}" -np 4 "$TRAIN" "$t" --no-site >"$DIR/out" 2>"$DIR/err" </dev/null; rc=$?
  if [[ $rc -eq 0 ]] || ! grep -qF -- "meshrun-train: $line" "$DIR/err"; then
    bad "$name: meshrun-train: exit $rc, $(grep -m1 'meshrun-train' "$DIR/err")"; ok=0
  fi
  [[ $ok == 1 ]] && pass "$name: plan, sbatch, run, exec and meshrun-train refuse it with: $line"
  rows=$((rows + 1))
done <"$DIR/table"
[[ $rows -ge 6 ]] || bad "the table has $rows rows"
# The table can fail: the unmodified template is accepted by all five (a dry run of each; one training step).
t=$SRC/templates/tiny.toml
"$MESHRUN" plan "$t" --no-site >/dev/null 2>&1 && "$MESHRUN" sbatch "$t" --no-site --plugin no --dry-run >/dev/null 2>&1 &&
  "$MESHRUN" run "$t" --no-site --dry-run >/dev/null 2>&1 &&
  "${MPI[@]}" -np 4 "$TRAIN" "$t" --no-site --set training.steps=1 --no-metrics >/dev/null 2>&1 &&
  pass "the unmodified tiny template passes plan, sbatch, run and one training step" || bad "tiny itself was refused"
# --for another trainer leaves the bundled trainer's rules out (a GELU model is fine for Megatron).
"$MESHRUN" plan "$DIR/trainer-mlp.toml" --no-site --for megatron >/dev/null 2>&1 &&
  pass "plan --for megatron accepts the GELU model meshrun-train refuses" || bad "--for megatron applied meshrun-train's rules"
exit $fail
