#!/usr/bin/env python3
"""Independent check of `meshrun plan --for megatron|torchtitan` (issue 27, bridges).

Re-implements, from the frameworks' own sources and not from meshrun's code, how each framework turns the
flags meshrun prints into process groups, and compares them with meshrun's map (`meshrun plan --format json`:
"ranks" with tp/cp/pp/dp/ep coordinates and "groups").

Megatron-LM (d98e8a64): megatron/core/parallel_state.py, RankGenerator and
generate_masked_orthogonal_rank_groups: the order string is written fastest axis first; a group of token
"x-y" holds the ranks that differ only in x and y, listed by mixed-radix decomposition. The dense grid is
RankGenerator(tp, ep=1, dp, pp, cp, order); the expert grid RankGenerator(tp=ETP, ep, dp=W/(ETP*EP*PP), pp,
cp=1, order) (initialize_model_parallel). order = 'tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with
--use-tp-pp-dp-mapping (megatron/training/initialize.py).

torchtitan (b5bcd76c): torchtitan/distributed/parallel_dims.py builds init_device_mesh over arange(W)
reshaped row-major to ("pp", "dp_replicate", "dp_shard", "cp", "tp"); the expert mesh is ("pp",
"dp_replicate", "efsdp", "ep") with efsdp = dp_shard*cp*tp/ep.

usage: bridges_check.py megatron|torchtitan PLAN.json FLAGS...   exit 0 when every group matches
"""
import json
import sys
from math import prod


def prefix_product(a, init=1):
    out = [init]
    for v in a:
        init *= v
        out.append(init)
    return out


def decompose(index, shape):
    stride = prefix_product(shape)
    return [(index // d) % s for s, d in zip(shape, stride)]


def masked_groups(world, sizes, mask):
    """Megatron's generate_masked_orthogonal_rank_groups, re-derived: ranks are sum(coord_i * stride_i) with
    prefix-product strides; a group varies the masked axes, the unmasked ones pick the group."""
    stride = prefix_product(sizes)
    m_shape = [s for s, m in zip(sizes, mask) if m]
    u_shape = [s for s, m in zip(sizes, mask) if not m]
    m_stride = [d for d, m in zip(stride, mask) if m]
    u_stride = [d for d, m in zip(stride, mask) if not m]
    size = prod(m_shape)
    groups = []
    for g in range(world // size):
        base = sum(c * d for c, d in zip(decompose(g, u_shape), u_stride))
        groups.append([base + sum(c * d for c, d in zip(decompose(r, m_shape), m_stride)) for r in range(size)])
    return groups


def megatron_groups(world, flags):
    def val(name, default):
        return int(flags[flags.index(name) + 1]) if name in flags else default
    tp = val("--tensor-model-parallel-size", 1)
    pp = val("--pipeline-model-parallel-size", 1)
    cp = val("--context-parallel-size", 1)
    ep = val("--expert-model-parallel-size", 1)
    etp = val("--expert-tensor-parallel-size", tp)
    order = "tp-cp-ep-pp-dp" if "--use-tp-pp-dp-mapping" in flags else "tp-cp-ep-dp-pp"
    dp = world // (tp * pp * cp)

    def generator(sizes):
        names = order.split("-")
        ordered = [sizes[n] for n in names]

        def get(token):
            want = token.split("-")
            return masked_groups(world, ordered, [n in want for n in names])
        return get

    dense = generator({"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp})
    expert = generator({"tp": etp, "cp": 1, "ep": ep, "dp": world // (etp * ep * pp), "pp": pp})
    out = {"tp": dense("tp"), "cp": dense("cp"), "pp": dense("pp"), "dp": dense("dp"), "dp_cp": dense("dp-cp")}
    if ep > 1:
        out["ep"] = expert("ep")
        out["edp"] = expert("dp")
        out["etp"] = expert("tp")
    return out


def torchtitan_groups(world, flags):
    def val(name, default):
        return int(flags[flags.index(name) + 1]) if name in flags else default
    tp = val("--parallelism.tensor_parallel_degree", 1)
    cp = val("--parallelism.context_parallel_degree", 1)
    pp = val("--parallelism.pipeline_parallel_degree", 1)
    dpr = val("--parallelism.data_parallel_replicate_degree", 1)
    dps = val("--parallelism.data_parallel_shard_degree", -1)
    ep = val("--parallelism.expert_parallel_degree", 1)
    if dps == -1:
        dps = world // (tp * cp * pp * dpr)
    assert pp * dpr * dps * cp * tp == world, "torchtitan degrees do not multiply to the world size"

    def along(shape, names, which):
        # init_device_mesh(arange(W).reshape(shape)): row-major, the last name fastest.
        strides = {n: prod(shape[i + 1:]) for i, n in enumerate(names)}
        sizes = dict(zip(names, shape))
        vary = [n for n in names if n in which]
        fixed = [n for n in names if n not in which]
        groups = []

        def walk(ns, acc, out):
            if not ns:
                out.append(acc)
                return
            for c in range(sizes[ns[0]]):
                walk(ns[1:], acc + c * strides[ns[0]], out)
        bases = []
        walk(fixed, 0, bases)
        for b in bases:
            members = []
            # members in mesh order: the varying names, slowest first
            walk(vary, b, members)
            groups.append(sorted(members))
        return groups

    names = ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    shape = [pp, dpr, dps, cp, tp]
    out = {"tp": along(shape, names, {"tp"}), "cp": along(shape, names, {"cp"}), "pp": along(shape, names, {"pp"}),
           "dp": along(shape, names, {"dp_replicate", "dp_shard"}),
           "dp_cp": along(shape, names, {"dp_replicate", "dp_shard", "cp"})}
    if ep > 1:
        efsdp = dps * cp * tp // ep
        sparse = ["pp", "dp_replicate", "efsdp", "ep"]
        s_shape = [pp, dpr, efsdp, ep]
        out["ep"] = along(s_shape, sparse, {"ep"})
        out["edp"] = along(s_shape, sparse, {"dp_replicate", "efsdp"})
    return out


def main():
    framework, plan_path, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    plan = json.load(open(plan_path))
    world = plan["world_size"]
    theirs = (megatron_groups if framework == "megatron" else torchtitan_groups)(world, flags)
    ours = plan["groups"]
    bad = []
    if "etp" in theirs:  # meshrun keeps ETP = TP: the expert tensor groups are its TP groups
        theirs["tp_expert"] = theirs.pop("etp")
        ours = dict(ours, tp_expert=ours["tp"])
    for kind, groups in theirs.items():
        mine = ours.get(kind)
        if mine is None:
            bad.append(f"{kind}: meshrun has no such groups")
            continue
        if sorted(map(list, groups)) != sorted(map(list, mine)):
            bad.append(f"{kind}: {framework} {sorted(groups)[:3]}... meshrun {sorted(mine)[:3]}...")
    # Coordinates: each rank's index in its group is its coordinate on that axis, as the framework reports
    # it (get_tensor_model_parallel_rank, mesh coordinate).
    coords = {r["rank"]: r for r in plan["ranks"]} if len(plan["ranks"]) == world else {}
    for kind in ("tp", "cp", "pp", "dp", "ep"):
        for g in theirs.get(kind, []):
            for i, rank in enumerate(g):
                if rank in coords and coords[rank][kind] != i:
                    bad.append(f"rank {rank}: {kind} = {coords[rank][kind]} in meshrun's map, {i} under {framework}")
                    break
    if bad:
        print("\n".join(bad[:6]))
        return 1
    kinds = ", ".join(f"{k} ({len(v)})" for k, v in theirs.items())
    print(f"{framework}: {world} ranks, groups equal: {kinds}; coordinates of {len(coords)} ranks equal")
    return 0


if __name__ == "__main__":
    sys.exit(main())
