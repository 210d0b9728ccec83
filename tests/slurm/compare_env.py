#!/usr/bin/env python3
"""Checks every task's environment (MESHENV lines from dump_env.sh) against `meshrun plan --format json`.

usage: compare_env.py DUMP PLAN.json
Every rank of the plan must appear exactly once, and each task's variables must equal the plan's values for
its rank. Exit 0 and one summary line when all match, else 1 with one line per mismatch.
"""
import json
import sys


def tasks_from(path):
    tasks = []
    with open(path) as f:
        for line in f:
            if not line.startswith("MESHENV"):
                continue
            env = {}
            for kv in line.split()[1:]:
                k, _, v = kv.partition("=")
                env[k] = v
            tasks.append(env)
    return tasks


def main():
    tasks = tasks_from(sys.argv[1])
    plan = json.load(open(sys.argv[2]))
    ranks = {r["rank"]: r for r in plan["ranks"]}
    layout = plan["layout"]
    errors = []
    seen = set()
    if len(tasks) != plan["world_size"]:
        errors.append(f"{len(tasks)} tasks reported, plan has {plan['world_size']} ranks")
    for env in tasks:
        if "RANK" not in env:
            errors.append(f"task SLURM_PROCID={env.get('SLURM_PROCID')} has no RANK (plugin did not run)")
            continue
        r = int(env["RANK"])
        if r in seen:
            errors.append(f"RANK={r} seen twice")
        seen.add(r)
        want = ranks.get(r)
        if want is None:
            errors.append(f"RANK={r} is not in the plan")
            continue
        expect = {
            "RANK": env.get("SLURM_PROCID"),
            "LOCAL_RANK": want["local_rank"],
            "WORLD_SIZE": plan["world_size"],
            "SLURM_NODEID": want["node"],
            "SLURMD_NODENAME": want["host"],
            "MESHRUN_ORDER": layout["order"],
        }
        for axis in ("tp", "cp", "pp", "dp", "ep"):
            expect[f"MESHRUN_{axis.upper()}_RANK"] = want[axis]
            expect[f"MESHRUN_{axis.upper()}_SIZE"] = layout[axis]
        step_gpus = env.get("SLURM_STEP_GPUS", "")
        if step_gpus:  # the task's GPU is the step's GPU in the plan's slot
            expect["MESHRUN_GPU"] = step_gpus.split(",")[want["gpu"]]
        for key, value in expect.items():
            if env.get(key) != str(value):
                errors.append(f"rank {r}: {key}={env.get(key)} but expected {value}")
    missing = sorted(set(ranks) - seen)
    if missing:
        errors.append(f"ranks without a task: {missing[:10]}")
    for e in errors:
        print("MISMATCH", e)
    if errors:
        return 1
    print(f"ok: {len(tasks)} tasks match the plan ({layout['order']}, tp={layout['tp']} cp={layout['cp']} "
          f"pp={layout['pp']} dp={layout['dp']} ep={layout['ep']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
