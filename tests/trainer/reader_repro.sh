#!/bin/bash
# The readers of files a user points meshrun-train / meshrun-ckpt at, on the exact reproducers of the
# libFuzzer audit (docs/trainer.md, "Files meshrun-train reads"): one located line, exit 2, never a crash,
# an MPI_ABORT or a hang; each run under a 1 GiB address-space cap and a timeout.
# usage: reader_repro.sh MESHRUN_TRAIN TEMPLATE MESHRUN_CKPT
set -u
TRAIN=$1 TEMPLATE=$2 CKPT=$3
DIR=$(mktemp -d /tmp/meshrun-readers-XXXXXX)
trap 'rm -rf "$DIR"' EXIT
source "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/../sanitize/vmem_cap.sh"  # vmem_cap KIB: ulimit -v, except in the sanitizer build
# 1.5 GiB: the CUDA build's meshrun-train maps libcublasLt and libnccl (218 MB) before main, so 1 GiB of address
# space is no longer enough to start it (measured 2026-12-07: fails at 1.0 GiB, starts at 1.25 GiB); an allocation
# sized by the input (the overflow cases below) is still far above the cap.
capped() { (vmem_cap 1572864; ulimit -c 0; timeout 60 "$@"); }
# expect_line PATTERN DESCRIPTION -- command: exit 2 and exactly one output line, containing PATTERN.
expect_line() {
  local pattern=$1 what=$2; shift 3
  expect 2 "$pattern" "$what" -- capped "$@"
  [[ $(grep -c . "$DIR/out") -eq 1 ]] || bad "$what: $(grep -c . "$DIR/out") lines of output, expected one"
}

# A valid corpus (uint16, byte ids) for the checkpoint.load cases.
python3 -c "import sys; sys.stdout.buffer.write(b''.join((i % 200).to_bytes(2, 'little') for i in range(40000)))" >"$DIR/corpus.bin"
LOAD=("$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set data.path="$DIR/corpus.bin" --set training.steps=1 --set)

# 1. Safetensors headers (checkpoint.load). Each file: 8-byte little-endian length, the header, the payload.
st() {  # st NAME HEADER [PAYLOAD_BYTES]
  python3 - "$DIR/$1" "$2" "${3:-0}" <<'PY'
import sys
path, header, payload = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
open(path, "wb").write(len(header).to_bytes(8, "little") + header + b"\0" * payload)
PY
}
printf '6\x00\x00\x00\x00\x00\x00\x00{"w":{"dtype":"F32","shape":[-],"data_offsets":[0,0]}}' >"$DIR/dash.safetensors"
expect_line "dash.safetensors: safetensors header: malformed JSON" "audit reproducer (shape [-]): located error, not 'rank 0: stoll'" -- "${LOAD[@]}" checkpoint.load="$DIR/dash.safetensors"
grep -q "rank 0: stoll\|MPI_ABORT" "$DIR/out" && bad "stoll or MPI_ABORT still in the output"
st overflow.safetensors '{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'
expect_line "tensor w: shape .* holds more than 2^64 bytes" "shape product that overflowed" -- "${LOAD[@]}" checkpoint.load="$DIR/overflow.safetensors"
st wrap.safetensors '{"w":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}}' 4
expect_line "tensor w: shape .* holds more than 2^64 bytes" "shape product that wrapped to the offsets' 4 bytes" -- "${LOAD[@]}" checkpoint.load="$DIR/wrap.safetensors"
st negative.safetensors '{"w":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}' 16
expect_line "tensor w: shape entry -1 is not a non-negative integer" "negative dimensions" -- "${LOAD[@]}" checkpoint.load="$DIR/negative.safetensors"
st dtype.safetensors '{"w":{"dtype":"Q7","shape":[1000],"data_offsets":[0,0]}}'
expect_line 'tensor w: unknown dtype "Q7"' "unknown dtype (used to skip the size check)" -- "${LOAD[@]}" checkpoint.load="$DIR/dtype.safetensors"
st float.safetensors '{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}' 4
expect_line "shape entry 1.5 is not a non-negative integer" "fractional dimension" -- "${LOAD[@]}" checkpoint.load="$DIR/float.safetensors"
st overlap.safetensors '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' 8
expect_line "tensor data overlaps at payload byte 4" "overlapping tensors" -- "${LOAD[@]}" checkpoint.load="$DIR/overlap.safetensors"
python3 -c "
import sys; h=b'{\"w\":' + b'[' * 200000
open(sys.argv[1], 'wb').write(len(h).to_bytes(8, 'little') + h)" "$DIR/deep.safetensors"
expect_line "JSON nested deeper than 32 levels" "200,000 nested arrays: refused, no stack overflow" -- "${LOAD[@]}" checkpoint.load="$DIR/deep.safetensors"

# 2. Token files: a uint32 id >= 2^31 used to come back as a negative int32 and pass the vocab check. The
#    audit's bytes after its selector byte (ids 1, 0xffffff01, 255), repeated to one batch, then the case
#    where the bad id sits in a file of good ones.
python3 -c "
import sys
good = b''.join((i % 200).to_bytes(4, 'little') for i in range(2000))
open(sys.argv[1], 'wb').write(b'\x01\x00\x00\x00\x01\xff\xff\xff\xff\x00\x00\x00' + good)" "$DIR/neg.bin"
expect_line "neg.bin: token 1 has id 4294967041 >= model.vocab (256)" "uint32 id 0xffffff01 is refused with file, index, value and vocab" -- \
  "$TRAIN" "$TEMPLATE" --set parallel.tp=1 --set data.path="$DIR/neg.bin" --set data.token_dtype=uint32 --set training.steps=1

# 3. Checkpoint manifests (meshrun-ckpt inspect, the resume path's reader).
manifest() { mkdir -p "$DIR/$1" && printf '%s' "$2" >"$DIR/$1/manifest.json"; }
python3 -c "import sys; open(sys.argv[1], 'w').write('{\"format\":' + '[' * 200000)" "$DIR/deep.json"
mkdir -p "$DIR/mdeep" && cp "$DIR/deep.json" "$DIR/mdeep/manifest.json"
expect_line "mdeep/manifest.json: JSON nested deeper than 32 levels" "manifest nested 200,000 deep" -- "$CKPT" inspect "$DIR/mdeep"
manifest mver '{"format":"meshrun-checkpoint","version":1.9}'
expect_line "mver/manifest.json: version has the wrong type (1.9)" "fractional version is not truncated to 1" -- "$CKPT" inspect "$DIR/mver"
manifest mbig '{"format":"meshrun-checkpoint","version":4294967297}'
expect_line "mbig/manifest.json: version has the wrong type (4294967297)" "version 2^32 + 1 is not wrapped to 1" -- "$CKPT" inspect "$DIR/mbig"
manifest mjunk '{"format":'
expect_line "mjunk/manifest.json: malformed JSON" "truncated manifest" -- "$CKPT" inspect "$DIR/mjunk"
exit $fail
