#!/usr/bin/env python3
"""Rules by target: a job is held to the rules of the program that will run it (mesh rules_for_job).

templates/megatron-gpt-1.7b.toml is a GPT of Megatron-LM's scaling table (GELU, tied embeddings, multi-head
attention, vocabulary 50257) with job.trainer = "megatron":
  - plain `meshrun plan` and `plan --for megatron --estimate --format json` give the map, the framework's flags,
    the padded vocabulary and a memory and step-time estimate of the model Megatron builds;
  - for meshrun-train (job.trainer = "meshrun") plan, run --dry-run, sbatch --dry-run and meshrun-train refuse in
    one line, the same rule's; a framework template under meshrun-train is refused, with its command accepted;
  - every refusal's suggested fixes are taken from its text (`set KEY = VALUE`, `set it to false`, `--for F`) and
    each is applied alone: the refusal it answers goes away, and following the suggestions reaches a plan that
    passes (a fix that leads nowhere fails here);
  - Megatron's own rules apply (heads % tp, its schedules and orders) and meshrun-train's do not (vocab % tp);
    torchtitan's models are SwiGLU.
usage: rules_by_target.py MESHRUN MESHRUN_TRAIN   (run from the repository root)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

MESHRUN, TRAIN = sys.argv[1], sys.argv[2]
G = "templates/megatron-gpt-1.7b.toml"
failures = 0


def ok(name):
    print(f"ok   {name}")


def bad(name, detail=""):
    global failures
    failures += 1
    print(f"FAIL {name}")
    for line in detail.splitlines()[:8]:
        print(f"     | {line}")


def run(*args):
    env = {"PATH": os.environ["PATH"], "HOME": tempfile.gettempdir()}
    p = subprocess.run(list(args), capture_output=True, text=True, env=env, timeout=120)
    return p.returncode, p.stdout, p.stderr


def plan(*args):
    return run(MESHRUN, "plan", "--no-site", G, *args)


def check(name, cond, detail=""):
    ok(name) if cond else bad(name, detail)


# 1. The framework's plan: map, flags, padded vocabulary, estimate.
rc, out, err = plan("--for", "megatron", "--estimate", "--format", "json")
try:
    d = json.loads(out) if rc == 0 else {}
except json.JSONDecodeError:
    d = {}
fw = d.get("framework", {})
est = d.get("estimate", {})
check("plan --for megatron --estimate --format json: exit 0 with the rules, flags, vocabulary and estimate",
      rc == 0 and d.get("rules") == "layout+model+megatron" and fw.get("name") == "megatron"
      and "--num-layers" in fw.get("flags", []) and fw.get("vocab") == 50304 and len(d.get("ranks", [])) == 32
      and est.get("fits") is True and est.get("step_time_s", 0) > 0, err or out[:400])
# The estimate is of Megatron's model: the padded vocabulary (50304 · 2304 tied weights) and full logits.
rc2, out2, _ = run(MESHRUN, "plan", "--no-site", G, "--set", "job.trainer=meshrun", "--set", "model.mlp=swiglu",
                   "--set", "model.tied_embeddings=false", "--estimate", "--format", "json")
check("the estimate counts Megatron's padded vocabulary (the same model for meshrun-train has fewer parameters)",
      rc2 == 0 and est.get("params_total", 0) > 0 and json.loads(out2)["estimate"]["params_total"] != est["params_total"],
      out2[:300])
rc, out, err = plan()
check("plain plan of the template (job.trainer = megatron): the table, the flags and the padded vocabulary",
      rc == 0 and "Megatron-LM flags: --tensor-model-parallel-size 1" in out and
      "vocabulary 50257 padded to 50304 (Megatron-LM: a multiple of --make-vocab-size-divisible-by 128 × tp 1)" in out,
      err or out[-600:])
rc, out, err = plan("--for", "megatron")
check("plan --for megatron alone: the flags, one line", rc == 0 and out.count("\n") == 1 and out.startswith("--tensor"),
      err or out)
rc, out, err = plan("--estimate")
check("plain plan --estimate: the estimate", rc == 0 and "Estimate (cost model" in out and "Megatron-LM flags:" in out, err)
rc, out, err = plan("--search", "--top", "3")
check("plain plan --search for the framework", rc == 0 and "the template's own shape ranks" in out, err)
rc, out, err = plan("--set", "parallel.tp=8")
check("Megatron pads the vocabulary for tp 8 (50257 is no multiple of 8: meshrun-train's vocab-tp does not apply)",
      rc == 0 and "padded to 51200" in out, err)
rc, out, err = plan("--set", "parallel.tp=8", "--set", "job.trainer=torchtitan", "--set", "model.mlp=swiglu",
                    "--set", "parallel.zero_stage=3")
check("torchtitan keeps vocab % tp", rc == 2 and "model.vocab=50257 is not divisible by tp=8" in err, err)
rc, out, err = plan("--set", "model.heads=20", "--set", "model.kv_heads=20", "--set", "model.hidden=2560",
                    "--set", "parallel.tp=8")
check("Megatron's heads % tp applies", rc == 2 and "model.heads=20 is not divisible by tp=8" in err, err)
rc, out, err = plan("--set", "parallel.pp=2", "--set", "parallel.pipeline_schedule=zb", "--set", "model.layers=24")
check("a schedule Megatron lacks is refused by plain plan (rule framework-bridge)",
      rc == 2 and "Megatron-LM runs 1F1B and interleaved 1F1B pipelines" in err and err.count("\n") == 1, err)
rc, out, err = plan("--format", "svg")
check("plain plan --format svg of a framework template draws (no flags asked for)", rc == 0 and out.startswith("<svg"),
      err)

# 2. For meshrun-train: one line from every consumer, the same rule's text.
first = None
for name, args in [("plan", [MESHRUN, "plan", "--no-site", G]), ("run --dry-run", [MESHRUN, "run", "--no-site", G, "--dry-run"]),
                   ("sbatch --dry-run", [MESHRUN, "sbatch", "--no-site", G, "--dry-run", "--plugin", "no"]),
                   ("meshrun-train", [TRAIN, G, "--no-site"])]:
    rc, out, err = run(*args, "--set", "job.trainer=meshrun")
    line = err.strip().splitlines()[0] if err.strip() else ""
    rule = re.sub(r"^[^:]*: (invalid layout( \([^)]*\))?: )?", "", line)
    rule = re.sub(r" \[.*$| \(\+\d+ more.*$", "", rule)
    first = first or rule
    check(f"{name} for meshrun-train: refused, exit 2, the trainer-mlp rule ({rule[:60]}...)",
          rc == 2 and rule == first and rule.startswith('model.mlp = "gelu": meshrun-train builds'), err)
# A framework's template is no job of meshrun-train; under its own command it is.
for name, args in [("run", [MESHRUN, "run", "--no-site", G, "--dry-run"]),
                   ("sbatch", [MESHRUN, "sbatch", "--no-site", G, "--dry-run", "--plugin", "no"]),
                   ("meshrun-train", [TRAIN, G, "--no-site"])]:
    rc, out, err = run(*args)
    check(f"{name} of meshrun-train with job.trainer = megatron: refused in one line naming the key's place",
          rc == 2 and err.count("\n") == 1 and f'job.trainer = "megatron" ({G}:10:11): the template is for Megatron-LM' in err,
          err)
fixes = {  # the refusal's suggestions, each run
    "meshrun run T -- CMD": [MESHRUN, "run", "--no-site", G, "--dry-run", "--", "python3", "pretrain_gpt.py"],
    "meshrun sbatch T -- CMD": [MESHRUN, "sbatch", "--no-site", G, "--dry-run", "--plugin", "no", "--", "python3", "pretrain_gpt.py"],
    "meshrun exec --for megatron": [MESHRUN, "exec", "--no-site", "--template", G, "--for", "megatron", "--rank", "0",
                                    "--world-size", "32", "--master-addr", "127.0.0.1", "--print-env", "--", "true"],
}
_, _, refusal = run(MESHRUN, "run", "--no-site", G, "--dry-run")
for text, args in fixes.items():
    rc, out, err = run(*args)
    check(f"the suggestion '{text}' works", text.replace("T ", "").split(" --")[0].split()[-1] in refusal and rc == 0,
          err or refusal)

# 3. Every plan refusal's suggestions, followed: each fix alone removes its refusal, and some path reaches exit 0.
SET = re.compile(r'set ([a-z_]+\.[a-z_]+) = ("[^"]*"|[0-9A-Za-z_.]+)')


def suggestions(line):
    out = [("--set", f"{k}={v.strip(chr(34))}") for k, v in SET.findall(line)]
    if "set it to false" in line:
        out.append(("--set", line.split(" = ")[0].split()[-1] + "=false"))
    out += [("--for", f) for f in re.findall(r"--for (megatron|torchtitan)\b", line)]
    return out


def flat(pairs):
    return [w for pair in pairs for w in pair]


def with_fix(pairs, fix):
    return [p for p in pairs if p[1].split("=")[0] != fix[1].split("=")[0]] + [fix]


def answers(pairs, line):
    """the plan with these flags no longer prints the refusal `line`"""
    return line not in plan(*flat(pairs))[2]


def follow(pairs, depth, seen):
    """exit status 0 reachable from `pairs` ((flag, value), ...) by following suggestions, each checked to
    answer its refusal; a --set of a key replaces the earlier one."""
    rc, out, err = plan(*flat(pairs))
    if rc == 0:
        return True
    if depth == 0:
        return False
    reached = False
    for line in err.strip().splitlines():
        line = re.sub(r"^meshrun plan: (invalid layout \([^)]*\): )?", "", line)
        fixes = suggestions(line)
        if not fixes:
            bad(f"a refusal suggests no fix that can be run: {line}")
        for fix in fixes:
            after = with_fix(pairs, fix)
            key = tuple(after)
            if not answers(after, line):
                bad(f"the fix {' '.join(fix)} leaves its refusal: {line}")
                continue
            if key not in seen:
                seen[key] = follow(after, depth - 1, seen)
            reached = reached or seen[key]
    return reached


for start in [[("--set", "job.trainer=meshrun")], [("--set", "job.trainer=torchtitan")],
              [("--set", "job.trainer=meshrun"), ("--set", "parallel.pipeline_schedule=zb"), ("--set", "parallel.pp=2")]]:
    seen = {}
    reached = follow(start, 4, seen)
    check(f"plan {' '.join(flat(start))}: every suggested fix answers its refusal; {len(seen)} fixed plans tried, "
          f"{sum(seen.values())} reach exit 0", reached, "")

# The test can fail: a suggestion that does not work is caught.
line = plan("--set", "job.trainer=meshrun", "--set", "model.tied_embeddings=false")[2].strip()
line = re.sub(r"^meshrun plan: (invalid layout \([^)]*\): )?", "", line)
check("the check can fail: a fix that does not answer its refusal is told apart",
      line.startswith("model.mlp") and not answers([("--set", "job.trainer=meshrun"), ("--set", "model.name=other")], line)
      and answers([("--set", "job.trainer=meshrun"), ("--set", "model.mlp=swiglu")], line), line)

print(f"{'FAIL' if failures else 'ok'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
