#!/bin/bash
# NCCL_IB_HCA is one list per node (NVIDIA/nccl#1478, nv-legate/legate#528): `meshrun exec --print-env` for
# every local rank of two nodes, on every fixture and on the real exports in ../shared/topologies, gives the
# same NCCL_IB_HCA on all ranks of a node (the node's GPU-paired NICs), while MESHRUN_NIC still names each
# rank's own NIC. hca_scope = rank (an explicit site choice) differs per rank and is warned about by exec,
# plan and topo. Each command runs under timeout and a memory cap.
# usage: hca_per_node.sh MESHRUN FIXTURE_DIR SHARED_TOPOLOGY_DIR TINY_TEMPLATE
set -u
bin=$1 fixtures=$2 shared=$3 tiny=$4
fail=0
bad() { echo "FAIL: $*"; fail=1; }
. "$(dirname "$0")/../sanitize/vmem_cap.sh"  # vmem_cap KIB: ulimit -v, except in the sanitizer build
run() { (vmem_cap 2000000; timeout 60 "$@"); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '[site]\nhca_scope = "rank"\n' >"$tmp/rank.toml"

files=("$fixtures"/*.xml)
if [ -d "$shared" ]; then
  files+=("$shared"/*.xml)
else
  echo "note: $shared is absent (CI has a read-only copy of shared/ beside the clone); checking the fixtures only"
fi
checked=0
for xml in "${files[@]}"; do
  name=$(basename "$xml")
  gpus=$(run "$bin" topo --no-site --xml "$xml" --format json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["gpus"]))') ||
    { bad "$name: meshrun topo failed"; continue; }
  want=$(run "$bin" topo --no-site --xml "$xml" --format json |
         python3 -c 'import json,sys; l=json.load(sys.stdin)["nccl_ib_hca"]; print("=" + ",".join(l) if l else "")')
  [ -n "$want" ] || { bad "$name: no GPU-paired NIC in the topology"; continue; }
  world=$((2 * gpus))
  declare -A node_hca=() nics=()
  for ((r = 0; r < world; r++)); do
    out=$(run "$bin" exec --no-site --topology "$xml" --nodes 2 --gpus-per-node "$gpus" --mesh-tp 1 --set training.global_batch_size=64 \
          --rank $r --world-size $world --master-addr n1 --print-env 2>"$tmp/err") ||
      { bad "$name rank $r: exec failed: $(head -c 300 "$tmp/err")"; continue; }
    hca=$(echo "$out" | sed -n 's/^NCCL_IB_HCA=//p')
    nic=$(echo "$out" | sed -n 's/^MESHRUN_NIC=//p')
    node=$((r / gpus))
    [ "$hca" = "$want" ] || bad "$name rank $r: NCCL_IB_HCA=$hca, want the node's list $want"
    if [ -z "${node_hca[$node]+x}" ]; then node_hca[$node]=$hca
    elif [ "${node_hca[$node]}" != "$hca" ]; then bad "$name node $node: NCCL_IB_HCA differs between ranks (${node_hca[$node]} vs $hca)"; fi
    case ",${want#=}," in *",$nic,"*) ;; *) bad "$name rank $r: MESHRUN_NIC=$nic is not one of $want" ;; esac
    nics[$nic]=1
    grep -q 'hca_scope = rank' "$tmp/err" && bad "$name rank $r: warned about hca_scope = rank by default"
    checked=$((checked + 1))
  done
  # The explicit per-rank choice: each rank's own NIC, with NCCL's warning on stderr.
  distinct=0
  declare -A seen=()
  for ((r = 0; r < gpus; r++)); do
    out=$(run "$bin" exec --site "$tmp/rank.toml" --topology "$xml" --nodes 1 --gpus-per-node "$gpus" --mesh-tp 1 --set training.global_batch_size=64 \
          --rank $r --world-size $gpus --print-env 2>"$tmp/err") || { bad "$name rank $r: exec (rank scope) failed"; continue; }
    hca=$(echo "$out" | sed -n 's/^NCCL_IB_HCA=//p')
    nic=$(echo "$out" | sed -n 's/^MESHRUN_NIC=//p')
    [ "$hca" = "=$nic" ] || bad "$name rank $r: hca_scope = rank gave NCCL_IB_HCA=$hca, want =$nic"
    [ -z "${seen[$hca]+x}" ] && distinct=$((distinct + 1)) && seen[$hca]=1
    if [ $r -eq 0 ]; then
      grep -q 'hca_scope = rank.*NVIDIA/nccl#1478' "$tmp/err" || bad "$name: exec does not warn about hca_scope = rank"
    fi
  done
  unset seen node_hca nics
  echo "$name: $world ranks on 2 nodes, NCCL_IB_HCA$want on every rank; hca_scope = rank gives $distinct distinct lists"
done
[ $checked -gt 0 ] || bad "no rank checked"

# plan and topo warn when the site chose rank, and stay quiet by default.
plan=$(run "$bin" plan "$tiny" --site "$tmp/rank.toml" 2>&1)
echo "$plan" | grep -q 'hca_scope = rank.*NVIDIA/nccl#1478' || bad "meshrun plan does not warn about hca_scope = rank"
run "$bin" plan "$tiny" --no-site 2>&1 | grep -q 'hca_scope = rank' && bad "meshrun plan warns about hca_scope without it"
err=$(run "$bin" topo --site "$tmp/rank.toml" --xml "$fixtures/dgx-h100.xml" 2>&1 >/dev/null)
echo "$err" | grep -q 'warning: hca_scope = rank' || bad "meshrun topo does not warn about hca_scope = rank"
table=$(run "$bin" topo --no-site --xml "$fixtures/dgx-h100.xml")
echo "$table" | grep -q '^NCCL_IB_HCA (every rank of this node): =mlx5_0,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_9,mlx5_10,mlx5_11$' ||
  bad "meshrun topo does not print the node's NCCL_IB_HCA list"
exit $fail
