#!/bin/bash
# The checkpoint format's piece hash (docs/trainer.md, "Checkpoints"): a save records "piece_hash":
# "xxh3-64"; a checkpoint written before that field (golden/legacy-ckpt: step 1 of golden/legacy-ckpt.toml,
# 4 shards of TP 2 × DP 2 ZeRO-1, made by meshrun-train at f3355c0) still verifies, exports and resumes,
# in its own layout and another, with its legacy splitmix64 hashes, and a flipped byte in it is still
# refused; a legacy manifest relabelled "xxh3-64" and an unknown algorithm are refused, one line, exit 2.
# usage: checkpoint_format.sh MESHRUN_TRAIN MESHRUN_CKPT MPIRUN GOLDEN_DIR
set -u
TRAIN=$1 CKPT=$2 MPIRUN=$3 GOLDEN=$4
MPI=("$MPIRUN" --oversubscribe --allow-run-as-root --mca mpi_yield_when_idle 1)
DIR=$(mktemp -d /tmp/meshrun-ckpt-format-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"

# The fixture's token file (its length is one of the settings a resume must match).
python3 - "$DIR/tokens.bin" <<'PY'
import struct, sys
open(sys.argv[1], 'wb').write(b''.join(struct.pack('<H', (7 * i + i // 13) % 32) for i in range(4096)))
PY
RUN=("$TRAIN" "$GOLDEN/legacy-ckpt.toml" --set data.path="$DIR/tokens.bin")
fixture() { rm -rf "$DIR/$1"; cp -r "$GOLDEN/legacy-ckpt" "$DIR/$1"; }
# set_hash MANIFEST VALUE: sets (or, with "", removes) the top-level piece_hash field
set_hash() {
  python3 - "$1" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
if sys.argv[2]: m['piece_hash'] = sys.argv[2]
else: m.pop('piece_hash', None)
open(sys.argv[1], 'w').write(json.dumps(m, indent=1) + '\n')
PY
}
piece_hash() { python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('piece_hash', '(none)'))" "$1"; }
one_line() { local n; n=$(grep -c "$1" "$DIR/out"); [[ $n -eq 1 ]] && pass "  ... in one line" || bad "  ... $n lines"; }

fixture legacy
[[ $(piece_hash "$DIR/legacy/step-1/manifest.json") == "(none)" ]] && pass "the fixture's manifest has no piece_hash (legacy)" \
  || bad "the fixture is not a legacy checkpoint"

# 1. The legacy checkpoint through every reader: verify (every piece), export (one tensor at a time), resume.
expect 0 "verified: " "meshrun-ckpt inspect --verify checks the legacy hashes" -- "$CKPT" inspect "$DIR/legacy" --verify
expect 0 "wrote $DIR/export.safetensors" "meshrun-ckpt export of the legacy checkpoint" -- "$CKPT" export "$DIR/legacy" "$DIR/export.safetensors"
python3 - "$DIR/export.safetensors" "$DIR/legacy/step-1" <<'PY' && pass "the export equals the shards' parameter pieces, placed by block and range" || bad "export differs from the shards"
import json, struct, sys
def st(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: (v, b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]]) for k, v in h.items() if k != '__metadata__'}
ex = st(sys.argv[1]); m = json.load(open(sys.argv[2] + '/manifest.json'))
shapes = {t['name']: t['shape'] for t in m['tensors']}
want = {n: [None] * (s[0] * (s[1] if len(s) > 1 else 1)) for n, s in shapes.items()}
for f in m['files']:
    shard = st(sys.argv[2] + '/' + f['file'])
    for p in f['pieces']:
        if p['kind'] != 'param': continue
        r0, c0, rows, cols = p['block']; a, b = p['range']; C = shapes[p['tensor']][1] if len(shapes[p['tensor']]) > 1 else 1
        vals = struct.unpack('<%df' % (b - a), shard[p['key']][1])
        for i in range(a, b): want[p['tensor']][(r0 + i // cols) * C + c0 + i % cols] = vals[i - a]
assert ex.keys() == want.keys(), (sorted(ex), sorted(want))
for n, v in want.items():
    assert None not in v, n
    assert struct.unpack('<%df' % len(v), ex[n][1]) == tuple(v), n
PY
expect 0 "resuming from $DIR/legacy/step-1: step 1" "the legacy checkpoint resumes (its layout, TP 2 × DP 2)" -- \
  "${MPI[@]}" -np 4 "${RUN[@]}" --set checkpoint.dir="$DIR/legacy"
[[ $(piece_hash "$DIR/legacy/step-2/manifest.json") == xxh3-64 ]] && pass "the resumed run's save records piece_hash = xxh3-64" \
  || bad "step-2's piece_hash: $(piece_hash "$DIR/legacy/step-2/manifest.json")"
expect 0 "verified: " "the new save verifies" -- "$CKPT" inspect "$DIR/legacy/step-2" --verify
fixture other
expect 0 "resuming from $DIR/other/step-1: step 1" "the legacy checkpoint resumes in another layout (1 rank)" -- \
  "${RUN[@]}" --set checkpoint.dir="$DIR/other" --set cluster.gpus_per_node=1 --set parallel.tp=1 --set parallel.zero_stage=0

# 2. A flipped byte in a legacy shard (a parameter, so export reads it too) is refused, naming file and tensor.
fixture bad
key=$(python3 - "$DIR/bad/step-1/rank-00002.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], 'r+b'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
key = next(k for k in h if k != '__metadata__' and not k.startswith('optimizer.'))
off = h[key]['data_offsets'][0] + 4
f.seek(8 + n + off); c = f.read(1); f.seek(8 + n + off); f.write(bytes([c[0] ^ 0x01]))
print(key)
PY
)
expect 2 "rank-00002.safetensors: tensor $key: contents do not match the manifest's hash" \
  "a flipped bit in a legacy shard is refused on resume" -- "${MPI[@]}" -np 4 "${RUN[@]}" --set checkpoint.dir="$DIR/bad"
one_line "meshrun-train:"
expect 2 "rank-00002.safetensors: tensor $key: contents do not match" "... and by meshrun-ckpt export" -- \
  "$CKPT" export "$DIR/bad" "$DIR/x.safetensors"

# 3. The field selects the hash: legacy hashes labelled xxh3-64 do not match; an unknown name is refused.
fixture relabelled
set_hash "$DIR/relabelled/step-1/manifest.json" xxh3-64
expect 2 "contents do not match the manifest's hash" "legacy hashes under piece_hash = xxh3-64 are refused" -- \
  "$CKPT" inspect "$DIR/relabelled" --verify
fixture unknown
set_hash "$DIR/unknown/step-1/manifest.json" sha1
expect 2 "step-1/manifest.json: piece_hash \"sha1\" is not a hash this meshrun-train knows" \
  "an unknown piece_hash is refused on resume" -- "${MPI[@]}" -np 4 "${RUN[@]}" --set checkpoint.dir="$DIR/unknown"
one_line "meshrun-train:"
expect 2 "piece_hash \"sha1\" is not a hash" "... and by meshrun-ckpt inspect" -- "$CKPT" inspect "$DIR/unknown"
set_hash "$DIR/unknown/step-1/manifest.json" ""
expect 0 "verified: " "the same manifest without the field is legacy again and verifies" -- "$CKPT" inspect "$DIR/unknown" --verify
exit $fail
