#!/usr/bin/env python3
"""Checks the JSON contract of `meshrun plan` on the shipped templates, independently of the C++ code:
coordinates follow the documented formula, every (node, GPU) is used once, groups partition the world and
vary only along their axis, TP groups stay on one node where the issue requires it."""
import json
import subprocess
import sys

BIN = sys.argv[1]
failures = 0


def plan(*args):
    out = subprocess.run([BIN, "plan", "--no-site", *args, "--format", "json"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin"})
    if out.returncode != 0:
        raise AssertionError(f"plan {args} exited {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def check(name, cond, detail=""):
    global failures
    if cond:
        print(f"ok   {name}")
    else:
        failures += 1
        print(f"FAIL {name} {detail}")


def axis_strides(layout):
    order = [a for a in layout["order"].split("-") if a != "ep"]
    strides, s = {}, 1
    for a in order:
        strides[a] = s
        s *= layout[a]
    return strides


def verify(name, d):
    L, C = d["layout"], d["cluster"]
    world = d["world_size"]
    check(f"{name}: world = product", world == L["tp"] * L["cp"] * L["pp"] * L["dp"] == C["nodes"] * C["gpus_per_node"])
    ranks = d["ranks"]
    check(f"{name}: one entry per rank", [r["rank"] for r in ranks] == list(range(world)))
    slots = {(r["node"], r["gpu"]) for r in ranks}
    check(f"{name}: every (node, GPU) used exactly once", len(slots) == world)
    st = axis_strides(L)
    ok = all(r["rank"] == sum(r[a] * st[a] for a in st) for r in ranks)
    check(f"{name}: coordinates follow {L['formula']}", ok)
    for axis in ("tp", "cp", "pp", "dp", "ep"):
        groups = d["groups"][axis]
        members = sorted(m for g in groups for m in g)
        check(f"{name}: {axis} groups partition the world", members == list(range(world)))
        if axis != "ep":
            others = [a for a in ("tp", "cp", "pp", "dp") if a != axis]
            same = all(len({tuple(ranks[m][o] for o in others) for m in g}) == 1 and
                       sorted(ranks[m][axis] for m in g) == list(range(L[axis])) for g in groups)
            check(f"{name}: {axis} groups vary only along {axis}", same)
    return ranks


d = plan("templates/llama3-405b.toml")
ranks = verify("llama3-405b", d)
check("llama3-405b: 16,384 ranks", d["world_size"] == 16384 and len(ranks) == 16384)
check("llama3-405b: layout TP8 CP1 PP16 DP128",
      [d["layout"][k] for k in ("tp", "cp", "pp", "dp", "ep")] == [8, 1, 16, 128, 1])
check("llama3-405b: every TP group on one node",
      all(len({ranks[m]["node"] for m in g}) == 1 for g in d["groups"]["tp"]))
check("llama3-405b: 2048 TP groups of 8", len(d["groups"]["tp"]) == 2048 and all(len(g) == 8 for g in d["groups"]["tp"]))
check("llama3-405b: first host from the hostlist", ranks[0]["host"] == "node0001" and ranks[-1]["host"] == "node2048")
check("llama3-405b: no warnings", d["warnings"] == [])

d = plan("templates/llama3-405b-128k.toml")
ranks = verify("llama3-405b-128k", d)
check("llama3-405b-128k: TP8 CP16 PP16 DP8", [d["layout"][k] for k in ("tp", "cp", "pp", "dp")] == [8, 16, 16, 8])
check("llama3-405b-128k: CP groups cross the network",
      all(len({ranks[m]["node"] for m in g}) == 16 for g in d["groups"]["cp"]))

d = plan("templates/llama3-405b.toml", "--set", "parallel.order=tp-cp-pp-dp")
verify("llama3-405b (Meta's order)", d)
check("Meta's order: DP outermost", d["ranks"][2048 * 8 // 128]["dp"] == 1)

for t in ("tiny", "llama3-8b", "llama3-70b", "mixtral-8x7b"):
    d = plan(f"templates/{t}.toml")
    ranks = verify(t, d)
    if t == "mixtral-8x7b":
        check("mixtral: EP groups of 4 inside a node",
              all(len(g) == 4 and len({ranks[m]["node"] for m in g}) == 1 for g in d["groups"]["ep"]))
        check("mixtral: EP ranks share tp and pp",
              all(len({(ranks[m]["tp"], ranks[m]["pp"]) for m in g}) == 1 for g in d["groups"]["ep"]))



def verify_schedule(name, d):
    """`--schedule` JSON, checked without the C++ validator: every (micro-batch, chunk) runs F once and its
    backward once (BW, or B and W), on rank chunk mod pp; every send has its receive on the peer; the
    bubble follows its definition and, with unit costs, the textbook value."""
    s, L = d["schedule"], d["layout"]
    pp, v, m = s["pp"], s["virtual_stages"], s["microbatches"]
    check(f"{name} schedule: sizes from the layout", pp == L["pp"] and v == L["virtual_stages"] and len(s["ranks"]) == pp)
    counts, sends, recvs = {}, set(), set()
    for r in s["ranks"]:
        for a in r["actions"]:
            k = a["kind"]
            if k in ("F", "B", "W", "BW"):
                counts[(k, a["microbatch"], a["chunk"])] = counts.get((k, a["microbatch"], a["chunk"]), 0) + 1
                if a["chunk"] % pp != r["rank"]:
                    check(f"{name} schedule: chunk {a['chunk']} on rank {r['rank']}", False)
            elif k.startswith("send"):
                sends.add((k[5:], a["microbatch"], a["chunk"], r["rank"], a["peer"]))
            else:
                recvs.add((k[5:], a["microbatch"], a["chunk"], a["peer"], r["rank"]))
    once = all(counts.get(("F", mb, c)) == 1 and
               (counts.get(("BW", mb, c)) == 1 or (counts.get(("B", mb, c)) == 1 and counts.get(("W", mb, c)) == 1))
               for mb in range(m) for c in range(pp * v))
    check(f"{name} schedule: every F and backward exactly once", once)
    check(f"{name} schedule: sends and receives pair up", sends == recvs)
    idle = [r["idle"] for r in s["ranks"]]
    check(f"{name} schedule: bubble_fraction = total idle / (pp x makespan)",
          abs(s["bubble_fraction"] - sum(idle) / (pp * s["makespan"])) < 1e-12)
    if d["values"]["parallel.pipeline_schedule"]["value"] in ("1f1b", "gpipe", "interleaved"):
        check(f"{name} schedule: unit-cost bubble (p-1)/(V*m+p-1)",
              abs(s["bubble_fraction"] - (pp - 1) / (v * m + pp - 1)) < 1e-12, s["bubble_fraction"])
    check(f"{name} schedule: peak live micro-batches is the maximum over ranks",
          s["peak_live_microbatches"] == max(r["peak_live"] for r in s["ranks"]))


for t in ("llama3-70b", "llama3-405b", "mixtral-8x7b"):
    verify_schedule(t, plan(f"templates/{t}.toml", "--schedule"))
verify_schedule("tiny as ZB-H1 on 4 ranks", plan("templates/tiny.toml", "--schedule", "--set", "parallel.tp=1", "--set",
                                                  "parallel.pp=4", "--set", "parallel.pipeline_schedule=zb"))

# Negative control: the checker itself must notice a broken map.
bad = plan("templates/tiny.toml")
bad["ranks"][1]["gpu"] = 0
before = failures
slots = {(r["node"], r["gpu"]) for r in bad["ranks"]}
check("negative control: a duplicated GPU is detected", len(slots) != bad["world_size"])

print(f"{failures} failures")
sys.exit(1 if failures else 0)
