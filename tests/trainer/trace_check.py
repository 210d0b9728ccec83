#!/usr/bin/env python3
"""Checks a merged meshrun-train trace (--trace DIR writes DIR/trace.json) against Chrome's trace-event format
(JSON Object Format) and against the pipeline schedule of the same layout, computed independently by
`meshrun plan TEMPLATE --schedule --format json`.

usage: trace_check.py TRACE.json PLAN.json STEPS
  PLAN.json: meshrun plan's JSON for the traced layout (its "ranks" give every rank's pipeline coordinate, its
  "schedule" every pipeline rank's action list); STEPS: how many steps were traced (from step 1).

Checks: the top level ({"traceEvents": [...], "displayTimeUnit", "otherData"}); every event's required keys and
their types for its phase (only "X" complete and "M" metadata events are allowed; ts and dur non-negative finite
numbers; pid and tid integers); each rank's process is named "rank R (pp p, dp d, tp t, cp c) node N" with the
plan's coordinates; each rank's F, B, W and BW counts per step equal its pipeline rank's action counts in the
plan's table; the sends and receives pair up: for each ordered pair of ranks, the sends of one (in time order)
and the receives of the other name the same tensors (kind, step, micro-batch, chunk) in the same order, and no
receive ends before its send began (within the recorded clock error bound). Exit 0 when all hold, 1 with one
line per problem (at most 20) otherwise.
"""
import json
import math
import re
import sys
from collections import Counter, defaultdict

problems = []


def bad(msg):
    problems.append(msg)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def check(trace_path, plan_path, steps):
    with open(trace_path) as f:
        doc = json.load(f)
    with open(plan_path) as f:
        plan = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        bad("top level: not an object with a traceEvents array")
        return
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        bad(f"displayTimeUnit {doc.get('displayTimeUnit')!r} is not 'ms' or 'ns'")
    other = doc.get("otherData")
    if not isinstance(other, dict):
        bad("otherData is not an object")
        return
    if other.get("steps") != list(range(1, steps + 1)):
        bad(f"otherData.steps {other.get('steps')!r}, expected 1..{steps}")
    bound_us = other.get("clock_error_bound_us")
    if not is_num(bound_us) or bound_us < 0:
        bad(f"otherData.clock_error_bound_us {bound_us!r} is not a non-negative number")
        bound_us = 0

    coords = {r["rank"]: r for r in plan["ranks"]}
    table = plan["schedule"]["ranks"]
    world = plan["world_size"]

    x_events = []
    names = {}
    for i, e in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{i}]"
        if not isinstance(e, dict):
            bad(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in ("X", "M"):
            bad(f"{where}: ph {ph!r} is not in the allowed set ('X', 'M')")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            bad(f"{where}: name missing or not a non-empty string")
        for k in ("pid", "tid"):
            if not is_int(e.get(k)) or e[k] < 0:
                bad(f"{where}: {k} {e.get(k)!r} is not a non-negative integer")
        if "args" in e and not isinstance(e["args"], dict):
            bad(f"{where}: args is not an object")
        if ph == "X":
            for k in ("ts", "dur"):
                if not is_num(e.get(k)) or e[k] < 0:
                    bad(f"{where}: {k} {e.get(k)!r} is not a non-negative finite number")
            if not isinstance(e.get("cat"), str):
                bad(f"{where}: cat missing or not a string")
            args = e.get("args")
            if not isinstance(args, dict) or not is_int(args.get("step")) or not 1 <= args["step"] <= steps:
                bad(f"{where}: args.step missing or outside the traced steps 1..{steps}")
                continue
            x_events.append(e)
        else:
            kind = e.get("name")
            args = e.get("args")
            if kind in ("process_name", "thread_name"):
                if not isinstance(args, dict) or not isinstance(args.get("name"), str):
                    bad(f"{where}: {kind} without a string args.name")
                elif kind == "process_name":
                    names[e.get("pid")] = args["name"]
            elif kind in ("process_sort_index", "thread_sort_index"):
                if not isinstance(args, dict) or not is_int(args.get("sort_index")):
                    bad(f"{where}: {kind} without an integer args.sort_index")
            else:
                bad(f"{where}: metadata event {kind!r} is not process_name, thread_name or a sort index")
    if problems:
        return

    # One process per rank, named with the plan's coordinates.
    pattern = re.compile(r"^rank (\d+) \(pp (\d+), dp (\d+), tp (\d+), cp (\d+)\) node (\S.*)$")
    for r in range(world):
        name = names.get(r)
        m = pattern.match(name or "")
        if not m:
            bad(f"rank {r}: process name {name!r} is not 'rank R (pp p, dp d, tp t, cp c) node N'")
            continue
        got = tuple(int(x) for x in m.groups()[:5])
        c = coords[r]
        want = (r, c["pp"], c["dp"], c["tp"], c["cp"])
        if got != want:
            bad(f"rank {r}: process name says {got}, the plan has {want}")
    if sorted(names) != list(range(world)):
        bad(f"processes {sorted(names)}, expected ranks 0..{world - 1}")

    # F/B/W/BW per rank and step = the plan's table for the rank's pipeline coordinate.
    compute = defaultdict(Counter)
    for e in x_events:
        if e["cat"] == "compute":
            a = e["args"]
            for k in ("microbatch", "chunk", "stage"):
                if not is_int(a.get(k)):
                    bad(f"{e['name']} on rank {e['pid']}: args.{k} missing")
            compute[(e["pid"], a["step"])][e["name"]] += 1
    for r in range(world):
        want = Counter(a["kind"] for a in table[coords[r]["pp"]]["actions"] if a["kind"] in ("F", "B", "W", "BW"))
        for s in range(1, steps + 1):
            got = compute[(r, s)]
            if got != want:
                bad(f"rank {r} step {s}: compute actions {dict(sorted(got.items()))}, the plan's pipeline rank "
                    f"{coords[r]['pp']} has {dict(sorted(want.items()))}")
    total = sum(sum(c.values()) for c in compute.values())
    if total == 0:
        bad("no compute events")

    # Sends and receives pair up per ordered pair of ranks, in order, and causally.
    sends = defaultdict(list)
    recvs = defaultdict(list)
    for e in x_events:
        if e["cat"] != "p2p":
            continue
        a = e["args"]
        if not is_int(a.get("peer")) or not 0 <= a["peer"] < world:
            bad(f"{e['name']} on rank {e['pid']}: args.peer {a.get('peer')!r} is not a rank")
            continue
        family = e["name"].split("_", 1)[-1]
        key = (family, a["step"], a.get("microbatch"), a.get("chunk"))
        if e["name"].startswith("send_"):
            sends[(e["pid"], a["peer"])].append((e["ts"], key, e))
        elif e["name"].startswith("recv_"):
            recvs[(a["peer"], e["pid"])].append((e["ts"], key, e))
        else:
            bad(f"p2p event {e['name']!r} is neither a send nor a receive")
    if not sends:
        bad("no sends")
    for pair in sorted(set(sends) | set(recvs)):
        s_list = [x for x in sorted(sends.get(pair, []), key=lambda x: x[0])]
        r_list = [x for x in sorted(recvs.get(pair, []), key=lambda x: x[0])]
        if [k for _, k, _ in s_list] != [k for _, k, _ in r_list]:
            bad(f"rank {pair[0]} -> rank {pair[1]}: sends {[k for _, k, _ in s_list][:6]} but receives "
                f"{[k for _, k, _ in r_list][:6]}")
            continue
        for (_, k, se), (_, _, re_) in zip(s_list, r_list):
            if re_["ts"] + re_["dur"] < se["ts"] - bound_us - 1e-3:
                bad(f"rank {pair[0]} -> rank {pair[1]} {k}: the receive ended at {re_['ts'] + re_['dur']:.3f} us, "
                    f"before its send began at {se['ts']:.3f} us (clock error bound {bound_us:.3f} us)")


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        check(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        bad(f"cannot check: {type(e).__name__}: {e}")
    for p in problems[:20]:
        print(f"trace_check: {p}")
    if len(problems) > 20:
        print(f"trace_check: ... {len(problems) - 20} more")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
