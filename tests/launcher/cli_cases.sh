#!/bin/bash
# Command-line cases of `meshrun exec|sbatch|run|plot|preflight`, one per ctest entry: cli_cases.sh CASE
# Needs MESHRUN (the binary) and SRC (the source tree). Every command runs in a clean environment (no host
# SLURM_* variables) under a timeout; bad input must exit 2 with exactly one line on stderr.
set -u
case_name=$1
: "${MESHRUN:?set MESHRUN to the meshrun binary}" "${SRC:?set SRC to the source tree}"
work=$(mktemp -d /tmp/meshrun-cli-XXXXXX)
trap 'rm -rf "$work"' EXIT
TINY=$SRC/templates/tiny.toml

# m [VAR=value ...] -- ARGS...: runs meshrun with only PATH (plus the given variables) set.
m() {
  local vars=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  # The sanitizer build's options (suppressions, unwinder) survive the clean environment.
  local san=()
  for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS; do [ -z "${!v:-}" ] || san+=("$v=${!v}"); done
  env -i PATH=/usr/bin:/bin HOME="$work" "${san[@]}" "${vars[@]}" timeout 60 "$MESHRUN" "$@" >"$work/out" 2>"$work/err"
  echo $? >"$work/rc"
}
fail() { echo "FAIL [$case_name]: $*"; echo "--- stdout"; cat "$work/out"; echo "--- stderr"; cat "$work/err"; exit 1; }
expect_rc() { [ "$(cat "$work/rc")" = "$1" ] || fail "exit $(cat "$work/rc"), expected $1"; }
expect_out() { grep -qF -- "$1" "$work/out" || fail "stdout lacks: $1"; }
expect_err() { grep -qF -- "$1" "$work/err" || fail "stderr lacks: $1"; }
# Bad input: exit 2, one line on stderr holding every given fragment, nothing on stdout.
expect_bad() {
  expect_rc 2
  [ "$(wc -l <"$work/err")" = 1 ] || fail "stderr should be one line"
  [ ! -s "$work/out" ] || fail "stdout should be empty"
  for f in "$@"; do expect_err "$f"; done
}

case $case_name in
  sbatch-dry-run)
    m -- sbatch "$TINY" --dry-run --no-site --plugin no --cpus-per-task 2
    expect_rc 0
    expect_out "#SBATCH --nodes=1"
    expect_out "#SBATCH --ntasks-per-node=4"
    expect_out "#SBATCH --cpus-per-task=2"
    expect_out "$MESHRUN exec --template $TINY --no-site -- "
    expect_out "# --dry-run: nothing submitted"
    expect_out "template $TINY:"            # sources of the values
    bash -n "$work/out" || fail "the printed script is not valid bash"
    ;;
  sbatch-dry-run-sets)
    m SBATCH_PARTITION=gpu -- sbatch "$TINY" --dry-run --no-site --plugin no --set training.steps=7 --mesh-tp 1
    expect_rc 0
    expect_out "#SBATCH --partition=gpu"
    expect_out "--set parallel.tp=1 --set training.steps=7"
    expect_out "environment SBATCH_PARTITION"
    expect_out "flag --mesh-tp=1"
    ;;
  sbatch-missing-template)
    m -- sbatch "$work/nope.toml" --dry-run
    expect_bad "nope.toml" "no such file"
    ;;
  sbatch-no-template)
    m -- sbatch --dry-run
    expect_bad "missing TEMPLATE.toml"
    ;;
  sbatch-unknown-set-key)
    m -- sbatch "$TINY" --dry-run --no-site --set parallel.tpp=2
    expect_bad "--set parallel.tpp=2" "did you mean 'parallel.tp'"
    ;;
  sbatch-set-wrong-type)
    m -- sbatch "$TINY" --dry-run --no-site --set parallel.tp=two
    expect_bad "--set parallel.tp=two" "must be an integer"
    ;;
  sbatch-conflicting-layers)
    m SLURM_JOB_NUM_NODES=3 SLURM_NTASKS_PER_NODE=2 -- sbatch "$TINY" --dry-run --no-site --set parallel.dp=2
    expect_bad "invalid layout" "cluster.nodes=3 from environment SLURM_JOB_NUM_NODES" "parallel.dp=2 from set"
    ;;
  sbatch-template-syntax)
    printf '[parallel]\ntp = = 2\n' >"$work/bad.toml"
    m -- sbatch "$work/bad.toml" --dry-run --no-site
    expect_bad "bad.toml:2:"
    ;;
  sbatch-unknown-option)
    m -- sbatch "$TINY" --dry-rn
    expect_bad "unknown option '--dry-rn'"
    ;;
  sbatch-site-file)
    printf '[job]\naccount = "site-acct"\n' >"$work/site.toml"
    m MESHRUN_SITE_CONFIG="$work/site.toml" -- sbatch "$TINY" --dry-run --plugin no
    expect_rc 0
    expect_out "#SBATCH --account=site-acct"
    expect_out "site $work/site.toml:2:"
    m MESHRUN_SITE_CONFIG="$work/missing.toml" -- sbatch "$TINY" --dry-run --plugin no
    expect_bad "missing.toml" "site file not found"
    ;;
  exec-outside-slurm)
    m -- exec --no-site --template "$TINY" -- /bin/true
    expect_bad "cannot tell which rank" "--rank R --world-size N"
    ;;
  exec-no-command)
    m -- exec --no-site --template "$TINY" --rank 0 --world-size 4
    expect_bad "no command"
    ;;
  exec-bad-command)
    m -- exec --no-site --template "$TINY" --rank 0 --world-size 4 -- "$work/no-such-program"
    expect_bad "cannot run" "no-such-program"
    ;;
  exec-wrong-world)
    m -- exec --no-site --template "$TINY" --rank 0 --world-size 3 -- /bin/true
    expect_bad "--world-size 3" "needs 4"
    ;;
  exec-runs-command)
    m -- exec --no-site --template "$TINY" --rank 3 --world-size 4 -- /bin/sh -c 'echo "$RANK $LOCAL_RANK $MESHRUN_TP_RANK $MESHRUN_DP_RANK $WORLD_SIZE"'
    expect_rc 0
    [ "$(cat "$work/out")" = "3 3 1 1 4" ] || fail "expected '3 3 1 1 4'"
    ;;
  exec-mpirun-vars)
    m OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_LOCAL_RANK=2 OMPI_COMM_WORLD_LOCAL_SIZE=4 \
      -- exec --no-site --template "$TINY" -- /bin/sh -c 'echo "$RANK $MESHRUN_TP_RANK $MESHRUN_DP_RANK $MASTER_ADDR"'
    expect_rc 0
    [ "$(cat "$work/out")" = "2 0 1 127.0.0.1" ] || fail "expected '2 0 1 127.0.0.1'"
    ;;
  exec-forbidden-env)
    printf '[env]\nLD_PRELOAD = "/tmp/x.so"\n' >"$work/preload.toml"
    cat "$TINY" "$work/preload.toml" >"$work/t.toml"
    m -- exec --no-site --template "$work/t.toml" --rank 0 --world-size 4 -- /bin/true
    expect_bad "LD_PRELOAD"
    # Refused before anything is submitted, naming the template line (meshrun sbatch and run resolve it).
    m -- sbatch "$work/t.toml" --no-site --plugin no --dry-run
    expect_bad "[env] ($work/t.toml:" "sets LD_PRELOAD, which makes tasks load or run other code"
    m -- run "$TINY" --no-site --set env.RANK=3 -- /bin/true
    expect_bad "--set env.RANK sets RANK, which meshrun computes for each task"
    ;;
  run-local-4)
    m -- run "$TINY" --no-site -- /bin/sh -c 'echo "rank=$RANK/$WORLD_SIZE tp=$MESHRUN_TP_RANK"'
    expect_rc 0
    [ "$(grep -c '^rank=' "$work/out")" = 4 ] || fail "expected 4 ranks"
    for r in 0 1 2 3; do expect_out "rank=$r/4 tp=$((r % 2))"; done
    # The layout's warnings reach the terminal before the ranks start (as meshrun plan shows them).
    expect_err "meshrun run: warning: tp=2 runs over PCIe: node type 'generic' has no NVLink"
    ;;
  run-dry-run)
    m -- run "$TINY" --no-site --dry-run --set training.steps=3
    expect_rc 0
    expect_out "mpirun -np 4 --bind-to none"
    expect_out "exec --template $TINY --no-site --set training.steps=3 -- "
    expect_out "training.steps=3"
    ;;
  layout-warnings)
    # The resolved layout's warnings (here TP crossing the network) are resolve_job's: sbatch prints them as plan
    # does (before, only plan computed the network ones; `run` outside Slurm folds the nodes onto this machine,
    # where nothing crosses a network), and a layout that keeps TP inside a node has none.
    for sub in plan sbatch; do
      extra=(); [ $sub = sbatch ] && extra=(--dry-run --plugin no)
      m -- $sub "$TINY" --no-site "${extra[@]}" --nodes 2 --gpus-per-node 2 --mesh-order dp-tp-cp-ep-pp
      expect_rc 0
      grep -q "2 of 2 TP groups cross the network with order dp-tp-cp-ep-pp" "$work/out" "$work/err" ||
        fail "$sub: no TP-crosses-the-network warning"
      m -- $sub "$TINY" --no-site "${extra[@]}" --nodes 2 --gpus-per-node 2
      expect_rc 0
      grep -q "cross the network" "$work/out" "$work/err" && fail "$sub: a network warning for TP inside the node"
    done
    ;;
  run-folds-nodes)
    m -- run "$TINY" --no-site --dry-run --nodes 2 --gpus-per-node 2
    expect_rc 0
    expect_out "--set cluster.nodes=1 --set cluster.gpus_per_node=4"
    expect_err "on this machine"
    ;;
  run-inside-step)
    m SLURM_JOB_ID=5 SLURM_STEP_ID=0 SLURM_PROCID=1 -- run "$TINY" --no-site -- /bin/true
    expect_bad "SLURM_STEP_ID" "srun meshrun exec"
    ;;
  run-too-big)
    m -- run "$SRC/templates/llama3-405b.toml" --no-site
    expect_bad "16384 ranks" "meshrun sbatch"
    ;;
  help)
    for c in plan exec sbatch run plot preflight; do
      m -- "$c" --help
      expect_rc 0
      expect_out "usage: meshrun $c"
      expect_out "examples:"
    done
    ;;
  golden-scripts-parse)
    # Every golden batch script is valid bash, and shellcheck-clean where shellcheck is installed.
    n=0
    for f in "$SRC"/tests/launcher/golden/*.sbatch; do
      bash -n "$f" 2>"$work/err" || fail "$f does not parse: $(cat "$work/err")"
      if command -v shellcheck >/dev/null; then
        shellcheck -s bash "$f" >"$work/err" 2>&1 || fail "shellcheck $f: $(cat "$work/err")"
      fi
      n=$((n + 1))
    done
    [ $n -ge 9 ] || fail "only $n golden scripts found"
    ;;
  man-page)
    # The man page renders without warnings and names every option the subcommands' --help lists.
    command -v man >/dev/null || { echo "SKIP: man not installed"; exit 77; }
    if command -v groff >/dev/null; then
      groff -man -Tutf8 -ww -z "$SRC/launcher/meshrun.1" 2>"$work/err"
      [ ! -s "$work/err" ] || fail "groff warnings: $(cat "$work/err")"
    fi
    MANWIDTH=200 man -l "$SRC/launcher/meshrun.1" 2>/dev/null | sed 's/\x1b\[[0-9;]*m//g' >"$work/man.txt"
    for c in plan exec sbatch run plot preflight; do
      m -- "$c" --help
      for opt in $(grep -o '^  --[a-z-]*' "$work/out"); do
        grep -q -- "$opt" "$work/man.txt" || fail "the man page does not mention $c's $opt"
      done
    done
    ;;
  completion)
    # The bash completion offers subcommands, flags, template keys and template files.
    complete_words() {
      (cd "$SRC" && bash -c 'source scripts/meshrun.bash-completion; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1));
        _meshrun; printf "%s\n" "${COMPREPLY[@]}"' _ "$@")
    }
    [ "$(complete_words meshrun sb)" = sbatch ] || fail "subcommand"
    complete_words meshrun sbatch templates/tiny.toml --dr | grep -qx -- --dry-run || fail "sbatch flag"
    complete_words meshrun exec --print | grep -qx -- --print-env || fail "exec flag"
    complete_words meshrun run --set parallel.t | grep -qx parallel.tp= || fail "--set key"
    complete_words meshrun plan templates/ti | grep -qx templates/tiny.toml || fail "template path"
    complete_words meshrun plan templates/tiny.toml --sch | grep -qx -- --schedule || fail "plan --schedule"
    complete_words meshrun run x.toml -- ech | grep -qx echo || fail "command after --"
    complete_words meshrun plot tests/launcher/plot/run-tp | grep -qx tests/launcher/plot/run-tp2-dp2.jsonl || fail "plot: metrics file"
    complete_words meshrun plot x.jsonl --tem | grep -qx -- --template || fail "plot --template"
    complete_words meshrun plot --time | grep -qx -- --timeline || fail "plot --timeline"
    complete_words meshrun plot --timeline tests/launcher/plot/trace-tiny | grep -qx tests/launcher/plot/trace-tiny-pp2.json ||
      fail "plot --timeline: a trace file"
    ;;
  run-trainer-command)
    # `-- meshrun-train T` gets the job's overrides: trained with pp = 2 and 2 steps, as the ranks are laid out.
    # Before, the trainer got none of them and refused the MPI world (a layout mismatch at run time).
    TRAIN=$(dirname "$MESHRUN")/../trainer/meshrun-train
    [ -x "$TRAIN" ] || { echo "skip: no meshrun-train next to $MESHRUN"; exit 77; }
    m -- run "$TINY" --no-site --mesh-pp 2 --set training.steps=2 -- "$TRAIN" "$TINY"
    expect_rc 0
    expect_out "layout tp=2 cp=1 pp=2 dp=1"
    expect_out "step     2/2"
    grep -q "step     3/" "$work/out" && fail "training.steps = 2 did not reach the trainer"
    # The template is added where the command names none.
    m -- run "$TINY" --no-site --set training.steps=1 --dry-run -- "$TRAIN" --metrics m.jsonl
    expect_rc 0
    expect_out "-- $TRAIN $TINY --metrics m.jsonl --no-site --set training.steps=1"
    ;;
  plan-schedule-width)
    # --max-width N folds the --schedule timeline into panels: no timeline line over N characters, and each
    # rank's panels put end to end give its one-line timeline (405B: 16 ranks, lines of 3,864 characters).
    B405=$SRC/templates/llama3-405b.toml
    m -- plan "$B405" --no-site --schedule
    expect_rc 0
    cp "$work/out" "$work/whole"
    m -- plan "$B405" --no-site --schedule --max-width 100
    expect_rc 0
    expect_out "  time 0-"
    python3 - "$work/whole" "$work/out" 100 <<'PY' || fail "the panels are not the whole timeline folded at 100 characters"
import re, sys
def rows(path):
    out = {}
    for line in open(path).read().split("\n"):
        m = re.match(r"  rank (\d+)  ", line)
        if m: out.setdefault(int(m.group(1)), []).append((line, line[len("  rank 15  "):]))
    return out
whole, folded, width = rows(sys.argv[1]), rows(sys.argv[2]), int(sys.argv[3])
assert whole.keys() == folded.keys() and len(whole) == 16, (len(whole), len(folded))
for k in whole:
    assert len(whole[k]) == 1 and len(folded[k]) > 1
    assert max(len(l) for l, _ in folded[k]) <= width, max(len(l) for l, _ in folded[k])
    # the panels are cut on column boundaries and each panel's trailing blanks trimmed: the same actions and
    # idle columns in the same order
    joined = " ".join(seg for _, seg in folded[k]).split()
    if joined != whole[k][0][1].split():
        sys.exit(f"rank {k}: the panels' actions differ from the whole line's")
PY
    # without it the timeline line is long (the check above can fail)
    [ "$(awk '/^  rank 0 /{print length($0)}' "$work/whole")" -gt 100 ] || fail "the unfolded line is not over 100 characters"
    m -- plan "$B405" --no-site --schedule --max-width 0
    expect_bad "--max-width 0: expected a line width"
    m -- plan "$B405" --no-site --schedule --max-width wide
    expect_bad "--max-width wide: expected a line width"
    m -- plan "$B405" --no-site --max-width 100
    expect_bad "--max-width folds the text timeline of --schedule"
    m -- plan "$B405" --no-site --schedule --format json --max-width 100
    expect_bad "--max-width folds the text timeline of --schedule"
    m -- plan "$B405" --no-site --schedule --max-width 12
    expect_bad "--max-width 12 is narrower than the rank column and one time column" "give at least --max-width"
    ;;
  run-trainer-flags)
    # `-- --metrics FILE`: words after -- that start with '-' are flags for the bundled trainer, which gets the
    # template and the job's overrides as with `-- meshrun-train ...`: a real 4-rank run writes the metrics.
    TRAIN=$(dirname "$MESHRUN")/../trainer/meshrun-train
    [ -x "$TRAIN" ] || { echo "skip: no meshrun-train next to $MESHRUN"; exit 77; }
    m -- run "$TINY" --no-site --set training.steps=2 -- --metrics "$work/m.jsonl"
    expect_rc 0
    expect_out "step     2/2"
    [ "$(grep -c '"record":"step"' "$work/m.jsonl" 2>/dev/null)" = 2 ] || fail "the trainer flag --metrics did not reach meshrun-train"
    m -- run "$TINY" --no-site --set training.steps=1 --dry-run -- --trace t
    expect_rc 0
    expect_out "meshrun-train $TINY --trace t --no-site --set training.steps=1"
    for plugin in yes no; do
      m -- sbatch "$TINY" --dry-run --no-site --plugin $plugin --set training.steps=7 -- --metrics m.jsonl
      expect_rc 0
      expect_out "meshrun-train $TINY --metrics m.jsonl --no-site --set training.steps=7"
    done
    # It is the trainer's job, so the trainer's rules apply (another program's job would take a GELU model).
    m -- run "$TINY" --no-site --set model.mlp=gelu --dry-run -- --trace t
    expect_bad "model.mlp"
    m -- run "$TINY" --no-site --set model.mlp=gelu --dry-run -- python3 train.py
    expect_rc 0
    # Flags naming another template are refused as `-- meshrun-train OTHER` is.
    m -- run "$TINY" --no-site --dry-run -- --metrics m.jsonl "$SRC/templates/llama3-8b.toml"
    expect_bad "the command after -- trains $SRC/templates/llama3-8b.toml but the job is laid out from $TINY"
    ;;
  sbatch-trainer-command)
    # sbatch, with and without the plugin: the overrides follow the trainer's own arguments.
    for plugin in yes no; do
      m -- sbatch "$TINY" --dry-run --no-site --plugin $plugin --mesh-pp 2 --set training.steps=7 -- meshrun-train "$TINY" --metrics m.jsonl
      expect_rc 0
      expect_out "meshrun-train $TINY --metrics m.jsonl --no-site --set parallel.pp=2 --set training.steps=7"
    done
    # Another program reads the layout from its environment: its command is left as written.
    m -- sbatch "$TINY" --dry-run --no-site --plugin no --set training.steps=7 -- python3 train.py --lr 1
    expect_rc 0
    expect_out "-- python3 train.py --lr 1"
    grep -q "train.py --lr 1 --" "$work/out" && fail "options appended to another program"
    # A trainer command naming another template would train another layout: refused.
    m -- sbatch "$TINY" --dry-run --no-site --plugin no -- meshrun-train "$SRC/templates/llama3-8b.toml"
    expect_bad "the command after -- trains $SRC/templates/llama3-8b.toml but the job is laid out from $TINY"
    ;;
  version)
    # Every program and subcommand answers --version with its name and the project's VERSION (read here from
    # CMakeLists.txt, not from the code), exit 0, one line.
    want=$(sed -n 's/^project(meshrun VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
    [ -n "$want" ] || fail "no VERSION in $SRC/CMakeLists.txt"
    m -- --version
    expect_rc 0
    [ "$(cat "$work/out")" = "meshrun $want" ] || fail "meshrun --version"
    for sub in plan topo sbatch run exec plot; do
      m -- $sub --version
      expect_rc 0
      [ "$(cat "$work/out")" = "meshrun $sub $want" ] || fail "meshrun $sub --version"
    done
    bin=$(dirname "$MESHRUN")/..
    for prog in trainer/meshrun-train trainer/meshrun-ckpt trainer/meshrun-tokenize device/meshrun-gpu-check; do
      [ -x "$bin/$prog" ] || continue
      env -i PATH=/usr/bin:/bin timeout 60 "$bin/$prog" --version >"$work/out" 2>"$work/err" || fail "$prog --version: exit $?"
      [ "$(cat "$work/out")" = "$(basename "$prog") $want" ] || fail "$prog --version printed '$(cat "$work/out")'"
    done
    for sub in inspect export; do
      [ -x "$bin/trainer/meshrun-ckpt" ] || continue
      "$bin/trainer/meshrun-ckpt" $sub --version >"$work/out" 2>&1 || fail "meshrun-ckpt $sub --version: exit $?"
      [ "$(cat "$work/out")" = "meshrun-ckpt $sub $want" ] || fail "meshrun-ckpt $sub --version"
    done
    ;;
  plan-no-template)
    # Flags only: no model, so the layout's rules alone, said so (the plugin's rule without --mesh-template).
    # tp = 8 would fail the default model's head count (4) if a hidden model were checked.
    m -- plan --no-site --nodes 2 --gpus-per-node 8 --mesh-tp 8
    expect_rc 0
    expect_out "model     none: no template, so only the layout's rules were checked"
    expect_out "checks passed (3, rules layout): world-size, ep-dp-cp, tp-nvlink"
    grep -q "heads\|batch  " "$work/out" "$work/err" && fail "a model or batch fact in a template-less plan"
    m -- plan --no-site --nodes 2 --gpus-per-node 8 --mesh-tp 8 --format json
    expect_rc 0
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); assert j["rules"] == "layout" and "chunk_layers" not in j, j["rules"]' \
      "$work/out" || fail "json: rules is not 'layout' or chunk_layers is shown"
    # The layout's rules still refuse: tp·cp·pp must divide the GPUs.
    m -- plan --no-site --nodes 2 --gpus-per-node 8 --mesh-tp 3
    expect_rc 2
    expect_err "needs the world size (16 GPUs) to be a multiple of tp·cp·pp = 3"
    # Negative control: with a template, its model's rules apply (tiny has 4 heads).
    m -- plan --no-site "$TINY" --nodes 2 --gpus-per-node 8 --mesh-tp 8
    expect_rc 2
    expect_err "model.heads=4 is not divisible by tp=8"
    m -- plan --no-site "$TINY" --format json
    expect_rc 0
    python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["rules"] == "layout+model+trainer"' "$work/out" || fail "json rules with a template"
    # What is about a model's steps needs one.
    for flag in --estimate --search --schedule; do
      m -- plan --no-site --nodes 2 --gpus-per-node 8 $flag
      expect_bad "$flag needs a template"
    done
    ;;
  plot-golden)
    # Two fixture files of different layouts (tests/launcher/plot/): a resumed run (steps 11-14 rewritten, a
    # straggler record to skip) and a step written twice (the first record a spike that must not show). The
    # SVG is byte-identical to the golden file and between two runs; it parses as XML.
    # MESHRUN_UPDATE_GOLDEN=1 rewrites the golden file after an intended change: review the picture and the diff.
    fx=$SRC/tests/launcher/plot
    golden=$SRC/tests/launcher/golden/plot-two-runs.svg
    m -- plot "$fx/run-tp2-dp2.jsonl" "$fx/run-pp2-dp2.jsonl" -o "$work/a.svg"
    expect_rc 0
    if [ -s "$work/out" ] || [ -s "$work/err" ]; then fail "plot printed something"; fi
    m -- plot "$fx/run-tp2-dp2.jsonl" "$fx/run-pp2-dp2.jsonl" -o "$work/b.svg"
    cmp -s "$work/a.svg" "$work/b.svg" || fail "two runs on the same input differ"
    if [ "${MESHRUN_UPDATE_GOLDEN:-}" = 1 ]; then cp "$work/a.svg" "$golden"; echo "updated $golden"; fi
    diff -u "$golden" "$work/a.svg" >"$work/diff" || fail "differs from $golden (MESHRUN_UPDATE_GOLDEN=1 rewrites it): $(head -40 "$work/diff")"
    if command -v xmllint >/dev/null; then
      xmllint --noout "$work/a.svg" 2>"$work/err" || fail "xmllint: $(cat "$work/err")"
    else
      python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$work/a.svg" || fail "not XML"
    fi
    # What the golden file holds, said in words: both layouts, the resume, the panels, no spike at step 7.
    for want in "tp2·dp2·zero1 (run-tp2-dp2.jsonl)" "pp2·dp2 (run-pp2-dp2.jsonl)" "resumed after step 10" \
                ">loss<" ">learning rate<" ">grad norm<" ">tokens/s (global: all ranks)<" ">MFU (%)<" "circles: eval loss"; do
      grep -qF -- "$want" "$work/a.svg" || fail "the SVG lacks: $want"
    done
    ;;
  plot-bad-input)
    # Bad input: exit 2, one line naming FILE:LINE (or FILE) and the problem, nothing written.
    printf '{"step":1,"loss":5}\n{"step":2,"loss":\n' >"$work/bad.jsonl"
    m -- plot "$work/bad.jsonl" -o "$work/x.svg"
    expect_bad "meshrun plot: $work/bad.jsonl:2: not JSON"
    [ ! -e "$work/x.svg" ] || fail "an output was written for bad input"
    printf '{"record":"run","schema":1,"start_step":0}\n{"record":"straggler","rank":1}\n' >"$work/nosteps.jsonl"
    m -- plot "$work/nosteps.jsonl" -o "$work/x.svg"
    expect_bad "$work/nosteps.jsonl: no step records (2 lines, 1 run records)"
    m -- plot "$work/missing.jsonl" -o "$work/x.svg"
    expect_bad "$work/missing.jsonl: cannot read the metrics file (no such file)"
    m -- plot "$work" -o "$work/x.svg"
    expect_bad "is a directory"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.svg" --colour red
    expect_bad "unknown option '--colour'"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl"
    expect_bad "no output; give -o OUT.svg or -o OUT.png"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.pdf"
    expect_bad "must end in .svg or .png"
    m -- plot -o "$work/x.svg"
    expect_bad "no metrics file"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.svg" --set training.steps=3
    expect_bad "--set and the --mesh-*/--nodes/--site flags apply to --template"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/no-such-dir/x.svg"
    expect_bad "no-such-dir/x.svg: cannot write"
    [ ! -e "$work/x.svg" ] || fail "an output was written for bad input"
    # The planner cannot estimate tiny's CPU "GPUs": its own one-line reason.
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.svg" --template "$TINY" --no-site
    expect_bad "--template: cluster.node_type 'generic' names no GPU model the planner knows"
    ;;
  plot-png)
    # PNG through rsvg-convert; without it on PATH, one line naming the package, exit 2.
    mkdir -p "$work/bin"
    env -i PATH="$work/bin" HOME="$work" /usr/bin/timeout 60 "$MESHRUN" plot \
      "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.png" >"$work/out" 2>"$work/err"
    echo $? >"$work/rc"
    expect_bad "-o $work/x.png needs rsvg-convert, which is not on PATH; install the package librsvg2-bin"
    [ ! -e "$work/x.png" ] || fail "a PNG was written without rsvg-convert"
    command -v rsvg-convert >/dev/null || { echo "SKIP: rsvg-convert not installed (package librsvg2-bin)"; exit 77; }
    m PATH="$(dirname "$(command -v rsvg-convert)"):/usr/bin:/bin" -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.png"
    expect_rc 0
    [ "$(head -c 8 "$work/x.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "not a PNG"
    ;;
  plot-estimate)
    # --template: the planner's figure (what plan --estimate prints per GPU) times the job's GPUs, as a dashed
    # line when it is near the measured curves, as a note "above this axis" when it is far above them.
    fx=$SRC/tests/launcher/plot/run-tp2-dp2.jsonl
    m -- plan "$TINY" --no-site --estimate --set cluster.gpu=h100-sxm
    expect_rc 0
    per_gpu=$(sed -n 's/^  throughput  \([0-9]*\) tokens\/s per GPU.*/\1/p' "$work/out")
    [ -n "$per_gpu" ] || fail "no throughput line in plan --estimate"
    m -- plot "$fx" -o "$work/far.svg" --template "$TINY" --no-site --set cluster.gpu=h100-sxm
    expect_rc 0
    grep -qF "↑ planner estimate: $per_gpu tokens/s per GPU × 4 GPUs (h100-sxm), above this axis" "$work/far.svg" ||
      fail "far.svg does not show plan --estimate's $per_gpu × 4 above the axis: $(grep -o 'planner estimate[^<]*' "$work/far.svg")"
    [ "$(grep -c 'class="estimate"' "$work/far.svg")" = 1 ] || fail "an off-scale estimate drew a line"
    # A GPU as slow as these cores: the estimate lands among the measured ~15k tokens/s and is drawn across.
    slow="--set cluster.gpu_bf16_tflops=0.05 --set cluster.gpu_memory_gib=8 --set cluster.nic_gbps=10"
    # shellcheck disable=SC2086  # the option list splits into words on purpose
    m -- plan "$TINY" --no-site --estimate $slow
    per_gpu=$(sed -n 's/^  throughput  \([0-9]*\) tokens\/s per GPU.*/\1/p' "$work/out")
    # shellcheck disable=SC2086
    m -- plot "$fx" -o "$work/near.svg" --template "$TINY" --no-site $slow
    expect_rc 0
    grep -qF "planner estimate: $per_gpu tokens/s per GPU × 4 GPUs" "$work/near.svg" || fail "near.svg lacks plan's $per_gpu"
    grep -qF "above this axis" "$work/near.svg" && fail "a near estimate was put off the axis"
    [ "$(grep -c 'class="estimate"' "$work/near.svg")" = 2 ] || fail "no dashed line across the panel"
    ;;
  preflight-mpirun)
    # meshrun preflight without Slurm: 2 ranks under mpirun (through meshrun run, i.e. meshrun exec binds them),
    # one node: every check of a CPU node, and the verdict lines; then the same ranks left unbound (exec
    # --no-bind): the binding row fails and the node is named.
    [ "$(nproc)" -ge 2 ] || { echo "SKIP: needs 2 CPUs"; exit 77; }
    command -v mpirun >/dev/null || { echo "SKIP: mpirun not installed"; exit 77; }
    m -- run "$TINY" --no-site --gpus-per-node 2 -- "$MESHRUN" preflight "$TINY" --no-site --gpus-per-node 2
    expect_rc 0
    expect_out "meshrun preflight: 1 node ("
    expect_out "skipped: no GPU on this node"
    grep -Eq '^[^ ]+ +binding +rank 0: CPUs [0-9,-]+; rank 1: CPUs [0-9,-]+ +PASS: as the rank map says$' "$work/out" || fail "binding row"
    grep -Eq '^[^ ]+ +gemm +[0-9.]+ GFLOP/s \(slowest of 0:[0-9.]+ 1:[0-9.]+\) +PASS' "$work/out" || fail "gemm row"
    expect_out "skipped: one node, no link to measure"
    expect_out "all 1 node passed"
    grep -Eq '^time: [0-9.]+ s' "$work/out" || fail "no time line"
    root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
    env -i PATH=/usr/bin:/bin HOME="$work" timeout 60 mpirun -np 2 --bind-to none "${root[@]}" "$MESHRUN" exec --no-bind \
      --template "$TINY" --no-site --gpus-per-node 2 -- "$MESHRUN" preflight "$TINY" --no-site --gpus-per-node 2 \
      >"$work/out" 2>"$work/err"
    echo $? >"$work/rc"
    expect_rc 1
    grep -Eq '^[^ ]+ +binding .* FAIL: rank 0 runs on CPUs [0-9,-]+, the map says [0-9,-]+' "$work/out" || fail "unbound ranks passed"
    expect_out "failing nodes: "
    ;;
  preflight-bad-input)
    m -- preflight "$TINY" --no-site
    expect_bad "not started as a job step" "srun --mpi=pmix"
    m -- preflight --min-fraction 0 "$TINY"
    expect_bad "--min-fraction 0: expected a number in (0, 1]"
    m -- preflight --timeout soon "$TINY"
    expect_bad "--timeout soon"
    m -- preflight "$TINY" --colour
    expect_bad "unknown option '--colour'"
    m OMPI_COMM_WORLD_RANK=0 -- preflight "$work/missing.toml"
    expect_bad "missing.toml"
    m -- preflight --help
    expect_rc 0
    expect_out "failing nodes: HOSTLIST"
    ;;
  plot-timeline)
    # A trace meshrun-train --trace wrote (tiny, pp 2 × dp 1 on 2 ranks, zb, 4 micro-batches; the docs' picture): the
    # same SVG twice, valid XML; the measured bubble printed equals this script's own reckoning from the file
    # (dp 0's ranks, step 2: idle in [first pipeline start, last end] over pp × that span), the simulated one
    # meshrun plan --schedule's for the same layout.
    fx=$SRC/tests/launcher/plot/trace-tiny-pp2.json
    m -- plot --timeline "$fx" -o "$work/a.svg"
    expect_rc 0
    [ ! -s "$work/err" ] || fail "plot --timeline wrote to stderr"
    cp "$work/out" "$work/summary"
    m -- plot --timeline "$fx" -o "$work/b.svg"
    cmp -s "$work/a.svg" "$work/b.svg" || fail "two runs on the same trace differ"
    if command -v xmllint >/dev/null; then
      xmllint --noout "$work/a.svg" 2>"$work/err" || fail "xmllint: $(cat "$work/err")"
    else
      python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$work/a.svg" || fail "not XML"
    fi
    want=$(python3 - "$fx" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
o = d["otherData"]
ranks = {r["pp"]: r["rank"] for r in o["ranks"] if r["dp"] == 0 and r["tp"] == 0 and r["cp"] == 0}
step = o["steps"][-1]
X = [e for e in d["traceEvents"] if e["ph"] == "X" and e["args"].get("step") == step]
phase = {e["pid"]: (e["ts"], e["ts"] + e["dur"]) for e in X if e["name"] == "pipeline"}
lo = min(phase[r][0] for r in ranks.values()); hi = max(phase[r][1] for r in ranks.values())
busy = {r: sum(e["dur"] for e in X if e["pid"] == r and e["name"] in ("F", "B", "W", "BW")) for r in ranks.values()}
print("%.4f" % (sum(hi - lo - b for b in busy.values()) / (len(ranks) * (hi - lo))))
PY
)
    cp "$work/summary" "$work/out"
    expect_out "  measured bubble_fraction $want (idle ÷ (pp × span)"
    m -- plan "$TINY" --no-site --schedule --format json --set cluster.gpus_per_node=2 --set parallel.tp=1 \
      --set parallel.pp=2 --set parallel.pipeline_schedule=zb --set training.global_batch_size=8 --set training.micro_batch_size=2
    sim=$(python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["schedule"]["bubble_fraction"])' <"$work/out")
    cp "$work/summary" "$work/out"
    expect_out "  simulated bubble_fraction $sim (the schedule simulator, as meshrun plan --schedule"
    expect_out "timeline: step 2 of $fx: tiny-llama, zb, pp 2, 4 micro-batches; measured on ranks 0 1 (dp 0)"
    for want_svg in "Measured: bubble_fraction $want" "Simulated: bubble_fraction $sim" "stage 1 · rank 1" ">W3<"; do
      grep -qF -- "$want_svg" "$work/a.svg" || fail "the SVG lacks: $want_svg"
    done
    ;;
  plot-timeline-bad-input)
    # Bad input: exit 2, one line, nothing on stdout, nothing written.
    fx=$SRC/tests/launcher/plot/trace-tiny-pp2.json
    m -- plot --timeline "$work/no-such-dir" -o "$work/x.svg"
    expect_bad "$work/no-such-dir"
    mkdir "$work/empty"
    m -- plot --timeline "$work/empty" -o "$work/x.svg"
    expect_bad "$work/empty: a directory without trace.json"
    m -- plot --timeline "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" -o "$work/x.svg"
    expect_bad "run-tp2-dp2.jsonl: not JSON"
    m -- plot --timeline "$fx" --step 5 -o "$work/x.svg"
    expect_bad "step 5 was not traced; the trace holds steps 1, 2"
    m -- plot --timeline "$fx" --step 0 -o "$work/x.svg"
    expect_bad "--step 0: give a traced step number"
    m -- plot "$SRC/tests/launcher/plot/run-tp2-dp2.jsonl" --step 2 -o "$work/x.svg"
    expect_bad "--step applies to --timeline"
    m -- plot --timeline "$fx" --template "$TINY" -o "$work/x.svg"
    expect_bad "--template and --set do not apply to --timeline"
    m -- plot --timeline "$fx" --timeline "$fx" -o "$work/x.svg"
    expect_bad "--timeline given twice"
    m -- plot --timeline "$fx"
    expect_bad "no output; give -o OUT.svg or -o OUT.png"
    [ ! -e "$work/x.svg" ] || fail "an output was written for bad input"
    m -- plot --timeline "$fx" -o "$work/no-such-dir/x.svg"
    expect_bad "no-such-dir/x.svg: cannot write"
    ;;
  *) echo "unknown case '$case_name'"; exit 2 ;;
esac
echo "ok [$case_name]"
