#!/bin/bash
# bench/gpu/bundle.sh (docs/gpu.md "The device check"): the directory a GPU machine without Debian's libraries
# runs bench/gpu/check.sh from. Checked here by hiding this machine's copies of every library the bundle
# carries, and Open MPI's and PMIx's plugins, in a private mount namespace (unshare -m; skipped, exit 77, where
# this machine does not allow one): meshrun-train must then start from the bundle alone, as an MPI singleton,
# and train tiny's first 2 steps on the CPU backend with the losses of the same run outside it; without the
# bundle's environment it must fail (the hiding works).
# usage: bundle_check.sh BUILD_DIR SOURCE_DIR
set -u
BUILD=$1 SRC=$2
DIR=$(mktemp -d /tmp/meshrun-bundle-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$SRC/tests/trainer/cli_lib.sh"

expect 2 "is not a CUDA build\|not found: build it" "bundle.sh refuses a tree without the CUDA binaries" -- \
  "$SRC/bench/gpu/bundle.sh" "$DIR/none" "$DIR/b0"
expect 0 "bytes;" "bundle.sh packs the CUDA build" -- "$SRC/bench/gpu/bundle.sh" "$BUILD" "$DIR/b"
B=$DIR/b
for f in bin/meshrun-train bin/meshrun-gpu-check bin/meshrun-nccl-check env.sh lib/libmpi.so.40 openmpi/mca_ess_singleton.so; do
  [[ -e $B/$f ]] || bad "the bundle lacks $f"
done
leaked=$(ls "$B/lib" | grep -E '^(libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda|libcublas|libnccl|libcudart)' | tr '\n' ' ')
[[ -z $leaked ]] && pass "the bundle carries no glibc, libstdc++ or NVIDIA library" || bad "the bundle carries $leaked"
size=$(du -sb "$B" | cut -f1)
(( size < 48 * 1024 * 1024 )) && pass "the bundle is $size bytes (the device tool carries 64 MiB with the tree)" \
  || bad "the bundle is $size bytes: too large to carry beside the tree"

# The bare machine: this machine's copies of what the bundle carries are hidden (bound over by /dev/null or an
# empty directory) for the commands run inside.
# One process does every mount (mount(8) itself loads libraries that are being hidden), then execs the command.
cat >"$DIR/bare.sh" <<'SH'
#!/bin/bash
exec python3 - "$@" <<'PY'
import ctypes, ctypes.util, glob, os, sys, tempfile
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MS_BIND = 4096
def bind(src, dst):
    if libc.mount(src.encode(), dst.encode(), None, MS_BIND, None) != 0:
        sys.exit(f"bare.sh: mount --bind {src} {dst}: {os.strerror(ctypes.get_errno())}")
bundle, cmd = sys.argv[1], sys.argv[2:]
empty = tempfile.mkdtemp()
for d in ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2", "/usr/share/openmpi", "/etc/openmpi"):
    if os.path.exists(d): bind(empty, d)
for f in ("/usr/bin/orted", "/usr/bin/mpirun"):
    if os.path.exists(f): bind("/dev/null", os.path.realpath(f))
for lib in glob.glob(os.path.join(bundle, "lib", "*")):
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"):
        p = os.path.join(d, os.path.basename(lib))
        if os.path.exists(p): bind("/dev/null", os.path.realpath(p))
os.execvp(cmd[0], cmd)
PY
SH
chmod +x "$DIR/bare.sh"
if ! unshare -m true 2>/dev/null; then
  echo "skipped: unshare -m is not permitted here, so the bare machine cannot be simulated"
  exit 77
fi
if ! out=$(unshare -m "$DIR/bare.sh" "$B" true 2>&1); then
  if [[ $out == "bare.sh: mount --bind"* ]]; then
    echo "skipped: bind mounts are not permitted in a new mount namespace here ($out)"
    exit 77
  fi
  bad "the bare-machine wrapper failed: $out"
fi

mkdir -p "$DIR/text"
write_lcg_corpus "$DIR/text/corpus.txt"
tiny=("$SRC/templates/tiny.toml" --set parallel.tp=1 --set parallel.dp=1 --set training.steps=2
      --set data.text="$DIR/text" --set data.text_cache="$DIR/corpus.bin")
expect 0 "finished steps 1..2" "the same run with this machine's libraries" -- \
  "$BUILD/trainer/meshrun-train" "${tiny[@]}" --metrics "$DIR/here.jsonl"
expect 0 "finished steps 1..2" "meshrun-train from the bundle alone, an MPI singleton" -- \
  unshare -m "$DIR/bare.sh" "$B" bash -c 'source "$1/env.sh"; shift; exec meshrun-train "$@"' _ "$B" "${tiny[@]}" \
  --metrics "$DIR/bare.jsonl"
python3 - "$DIR/here.jsonl" "$DIR/bare.jsonl" <<'PY' && pass "the bundled run gives the same losses" || bad "the bundled run's losses differ"
import json, sys
def steps(p): return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if r.get("record") == "step"]
a, b = steps(sys.argv[1]), steps(sys.argv[2])
sys.exit(0 if len(a) == 2 and a == b else 1)
PY
expect 0 "meshrun-gpu-check" "meshrun-gpu-check --version from the bundle" -- \
  unshare -m "$DIR/bare.sh" "$B" bash -c 'source "$1/env.sh"; exec meshrun-gpu-check --version' _ "$B"
# Negative: the hiding works, so the bundle is what made the runs above start.
unshare -m "$DIR/bare.sh" "$B" "$B/bin/meshrun-train" --version >"$DIR/out" 2>&1
[[ $? -ne 0 ]] && grep -q "meshrun-train: error while loading shared libraries" "$DIR/out" \
  && pass "without the bundle's environment it does not start: $(head -1 "$DIR/out")" \
  || { bad "meshrun-train started (or failed otherwise) with this machine's libraries hidden and no bundle environment"; head -3 "$DIR/out"; }
unshare -m "$DIR/bare.sh" "$B" bash -c 'source "$1/env.sh"; unset OMPI_MCA_mca_base_component_path; shift; exec meshrun-train "$@"' _ "$B" \
  "${tiny[@]}" >"$DIR/out" 2>&1
[[ $? -ne 0 ]] && grep -q "MPI_INIT" "$DIR/out" && pass "without the bundled Open MPI plugins MPI_Init fails" \
  || { bad "the singleton did not fail in MPI_Init without the bundled plugins"; head -5 "$DIR/out"; }
exit $fail
