#!/usr/bin/env python3
"""The schema walk (issue 44: "no key is accepted and ignored").

Every key of the config schema (meshrun-config-keys prints config_keys()) must be named below, in exactly one
of two tables:
  PROBES   keys meshrun-train reads: a non-default value (and what else the probe needs) that must either
           change what a short run does, or be refused in one line with exit 2. "What a run does" is its
           fingerprint: the exit status, every step's loss, gradient norm, learning rate and memory, the
           metrics' record types, the run record, the files it writes and the bytes of its final weights,
           and its warning lines. A probe whose fingerprint equals the baseline's is a key accepted and
           ignored: the test fails.
  ELSEWHERE keys meshrun-train does not read, with the consumer that does (the launcher, the plugin, the
           planner, `meshrun preflight`); the walk runs each of these too and requires that meshrun-train
           still trains the baseline's numbers (the key is not silently half-read).
A key in neither table, or in both, fails the test: a new key must be given a probe or a reader.

usage: schema_walk.py MESHRUN_CONFIG_KEYS MESHRUN_TRAIN TEMPLATE_DIR MPIRUN
"""
import hashlib
import json
import os
import shutil
import signal as signal_module
import subprocess
import time
import sys
import tempfile

KEYS_BIN, TRAIN, TEMPLATES, MPIRUN = sys.argv[1:5]
WORK = tempfile.mkdtemp(prefix="meshrun-schema-walk-")
TEXT = os.path.join(WORK, "text")
os.makedirs(TEXT)
# A deterministic corpus (the trainer's CLI tests' words), and a second one for data.valid.
words = ("the of and to in is that for it as with was on be by at this from are or an which not have "
         "pipeline tensor rank gradient expert sequence layer model data token shard batch").split()
x, out = 12345, []
for _ in range(12000):
    x = (1103515245 * x + 12345) & 0xFFFFFFFF
    out.append(words[(x >> 16) % len(words)])
open(os.path.join(TEXT, "corpus.txt"), "w").write(" ".join(out))
OTHER = os.path.join(WORK, "other")
os.makedirs(OTHER)
open(os.path.join(OTHER, "corpus.txt"), "w").write(" ".join(reversed(out)))

# The baseline: templates/tiny.toml on one rank (two micro-batches of 2 sequences of 32 tokens), 3 steps.
BASE = {
    "data.text": TEXT, "data.text_cache": os.path.join(WORK, "corpus.bin"),
    "parallel.tp": "1", "parallel.zero_stage": "0", "training.steps": "3", "training.seq_len": "32",
    "training.global_batch_size": "4", "training.micro_batch_size": "2", "training.warmup_steps": "1",
    "cluster.gpus_per_node": "1", "job.output_dir": "{run}/out",
}

# key: (value, {other keys this probe sets}, ranks, "differs" | "refused: <text of the one line>")
PROBES = {
    "job.output_dir": ("{run}/elsewhere", {}, 1, "differs"),
    "job.trainer": ("megatron", {}, 1, "refused: job.trainer = \"megatron\": the template is for Megatron-LM, which meshrun-train does not run"),
    "model.name": ("another-name", {}, 1, "reported"),  # a label: the run record and the exports carry it
    "model.layers": ("2", {}, 1, "differs"),
    "model.hidden": ("64", {}, 1, "differs"),
    "model.ffn_hidden": ("160", {}, 1, "differs"),
    "model.heads": ("8", {}, 1, "differs"),
    "model.kv_heads": ("4", {}, 1, "differs"),
    "model.vocab": ("300", {}, 1, "differs"),
    "model.mlp": ("gelu", {}, 1, "refused: model.mlp = \"gelu\": meshrun-train builds the Llama SwiGLU MLP"),
    "model.tied_embeddings": ("true", {}, 1, "refused: model.tied_embeddings = true: meshrun-train keeps Llama's untied LM head"),
    "model.experts": ("4", {"model.top_k": "2"}, 1, "differs"),
    "model.top_k": ("2", {"model.experts": "4"}, 1, "differs"),
    "model.moe_ffn_hidden": ("64", {"model.experts": "4", "model.top_k": "2"}, 1, "differs"),
    "model.router_aux": ("hf", {"model.experts": "4", "model.top_k": "2"}, 1, "differs"),
    "model.router_aux_loss_coef": ("0.5", {"model.experts": "4", "model.top_k": "2"}, 1, "differs"),
    "model.rope_theta": ("500000", {}, 1, "differs"),
    "model.norm_eps": ("0.1", {}, 1, "differs"),
    "parallel.tp": ("2", {}, 2, "differs"),
    "parallel.cp": ("2", {}, 2, "differs"),
    "parallel.pp": ("2", {}, 2, "differs"),
    "parallel.dp": ("1", {}, 2, "refused: "),
    "parallel.ep": ("2", {"model.experts": "4", "model.top_k": "2", "parallel.dp": "2"}, 2, "differs"),
    "parallel.order": ("tp-cp-ep-pp-dp", {"parallel.pp": "2", "training.micro_batch_size": "1"}, 4, "differs"),
    "parallel.virtual_stages": ("4", {"parallel.pp": "2", "parallel.pipeline_schedule": "interleaved",
                                      "parallel.virtual_stages": "2", "model.layers": "8",
                                      "training.global_batch_size": "8"}, 2, "differs"),
    "parallel.zero_stage": ("3", {"parallel.dp": "2"}, 2, "differs"),
    "parallel.sequence_parallel": ("true", {"parallel.tp": "2"}, 2, "differs"),
    "parallel.pipeline_schedule": ("gpipe", {"parallel.pp": "2", "training.micro_batch_size": "1"}, 2, "differs"),
    "parallel.cp_comm": ("allgather", {"parallel.cp": "2"}, 2, "differs"),
    "parallel.cp_alltoall": ("2", {"parallel.cp": "2"}, 2,
                             "refused: parallel.cp_alltoall = 2 applies only to parallel.cp_comm = \"alltoall+ring\""),
    "training.seq_len": ("64", {}, 1, "differs"),
    "training.global_batch_size": ("8", {}, 1, "differs"),
    "training.micro_batch_size": ("1", {}, 1, "differs"),
    "training.steps": ("2", {}, 1, "differs"),
    "training.lr": ("0.01", {}, 1, "differs"),
    "training.min_lr": ("0.002", {"training.steps": "4"}, 1, "differs"),
    "training.warmup_steps": ("2", {}, 1, "differs"),
    "training.lr_decay_steps": ("10", {}, 1, "differs"),
    "training.weight_decay": ("0.5", {}, 1, "differs"),
    "training.beta1": ("0.5", {}, 1, "differs"),
    "training.beta2": ("0.5", {}, 1, "differs"),
    "training.adam_eps": ("0.01", {}, 1, "differs"),
    "training.grad_clip": ("0.5", {}, 1, "differs"),
    "training.seed": ("99", {}, 1, "differs"),
    "training.recompute": ("full", {}, 1, "differs"),
    "training.dtype": ("bf16", {}, 1, "differs"),
    "training.device": ("cuda", {}, 1, "refused: "),
    # Margin 0 names the slower of the two ranks whenever their compute times differ at all, so these two do
    # not depend on how loaded the machine is (a 1% margin needs a 2% imbalance, which a busy machine may not
    # give, and the default 30% may be crossed by the reference on one).
    "training.straggler_interval": ("1", {"parallel.dp": "2", "training.straggler_margin": "0"}, 2, "differs"),
    "training.straggler_margin": ("0", {"parallel.dp": "2", "training.straggler_interval": "1"}, 2,
                                  "log: training.straggler_margin = 0%"),
    "training.eval_interval": ("2", {"data.valid": "{valid}", "training.eval_interval": "1"}, 1, "differs"),
    "training.eval_batches": ("2", {"data.valid": "{valid}", "training.eval_interval": "1"}, 1, "differs"),
    "training.param_dtype": ("fp32", {}, 1, "differs"),
    "training.grad_dtype": ("bf16", {}, 1, "differs"),
    "training.optim_dtype": ("bf16", {}, 1, "differs"),
    "data.path": ("{run}/missing.bin", {}, 1, "refused: "),
    "data.token_dtype": ("uint32", {}, 1, "refused: check data.token_dtype"),
    "data.shuffle": ("false", {}, 1, "differs"),
    "data.text": (OTHER, {"data.text_cache": "{run}/other.bin"}, 1, "differs"),
    "data.text_cache": ("{run}/cache.bin", {}, 1, "differs"),
    "data.tokenizer": ("{run}/missing.model", {}, 1, "refused: "),
    "data.blend": (f'[[1, "{TEXT}"]]', {}, 1, "refused: data.blend and data.text"),
    "data.valid": ("{valid}", {}, 1, "refused: data.valid is set but training.eval_interval = 0, so it is never read"),
    # The first 90% of the corpus's tokens: fewer shuffled windows, other samples.
    "data.split": ("9,1", {}, 1, "differs"),
    "checkpoint.dir": ("{run}/ck", {}, 1, "differs"),
    "checkpoint.interval": ("1", {"checkpoint.dir": "{run}/ck"}, 1, "differs"),
    "checkpoint.keep": ("1", {"checkpoint.dir": "{run}/ck", "checkpoint.interval": "1"}, 1, "differs"),
    "checkpoint.resume": ("false", {"checkpoint.dir": "{prepared}"}, 1, "differs"),
    # Sent SIGUSR2 after the first step of a long run: under the default (USR1) the signal kills the run,
    # with checkpoint.signal = USR2 it saves and stops.
    "checkpoint.signal": ("USR2", {"training.steps": "2000", "checkpoint.dir": "{run}/ck"}, 1, "differs", "USR2"),
    "checkpoint.signal_lead_s": ("0", {"checkpoint.dir": "{run}/ck", "checkpoint.interval": "1"}, 1,
                                 "log: longer than checkpoint.signal_lead_s = 0 s"),
    "checkpoint.load": ("{run}/missing.safetensors", {}, 1, "refused: "),
    # The prepared run's step-2 weights instead of initialization: the trained values differ.
    "checkpoint.finetune": ("{prepared}", {}, 1, "differs"),
    "checkpoint.save": ("", {}, 1, "differs"),
    # A failed save (a full disk) is what these two decide about: tests/trainer/checkpoint_integrity.sh case 4
    # fills a 14 MiB tmpfs and shows continue (training goes on, exit 1 at the end), stop (the first failure
    # ends the run) and the max_failures count; the walk does not mount file systems.
    "checkpoint.on_error": ("stop", {}, 1, "covered: trainer.checkpoint-integrity (full disk: on_error = stop ends the run at the first failed save)"),
    "checkpoint.max_failures": ("1", {}, 1, "covered: trainer.checkpoint-integrity (full disk: the failures counted against checkpoint.max_failures)"),
    "checkpoint.async": ("true", {"checkpoint.dir": "{run}/ck", "checkpoint.interval": "1"}, 1, "log: async: training waited"),
}

# key: (a value, the consumer that reads the key); the value must leave meshrun-train's numbers as the
# baseline's (or be refused by the rule that reads it, exit 2).
ELSEWHERE = {
    "job.name": ("another", "meshrun sbatch / run (the Slurm job name)"),
    "job.time": ("01:00:00", "meshrun sbatch (#SBATCH --time)"),
    "job.partition": ("gpu", "meshrun sbatch (#SBATCH --partition)"),
    "job.account": ("acct", "meshrun sbatch (#SBATCH --account)"),
    "job.qos": ("high", "meshrun sbatch (#SBATCH --qos)"),
    "cluster.nodes": ("1", "mesh's layout resolution (the world it checks against the allocation)"),
    "cluster.gpus_per_node": ("2", "mesh's layout resolution and the rank map"),
    "cluster.node_type": ("dgx-h100", "mesh (NVLink domains) and the planner (hardware)"),
    "cluster.nvlink_domain_gpus": ("1", "mesh's rank map (tp-nvlink) and the planner"),
    "cluster.hostlist": ("node[01-02]", "mesh's rank map (node names) and meshrun plan"),
    "cluster.gpu": ("h100", "the planner's hardware"),
    "cluster.gpu_memory_gib": ("40", "the planner's hardware"),
    "cluster.gpu_bf16_tflops": ("100", "the planner's hardware"),
    "cluster.gpu_sms": ("100", "the planner's hardware"),
    "cluster.nvlink_gbps": ("100", "the planner's hardware"),
    "cluster.nics_per_node": ("2", "the planner's hardware"),
    "cluster.nic_gbps": ("100", "the planner's hardware"),
    "site.nccl": ("off", "the site policy (launcher and plugin: the NCCL environment)"),
    "site.allow_env": ("FOO", "the site policy (launcher and plugin)"),
    "site.socket_ifname": ("eth9", "the site policy (launcher and plugin)"),
    "site.hca_scope": ("node", "the site policy (launcher and plugin)"),
    "site.cpu_bind": ("none", "the site policy (launcher and plugin)"),
    "site.port_base": ("31000", "the site policy (launcher and plugin: MASTER_PORT)"),
    "site.preflight_gemm_gflops": ("1", "meshrun preflight"),
    "site.preflight_p2p_gbs": ("1", "meshrun preflight"),
    "site.preflight_allreduce_gbs": ("1", "meshrun preflight"),
    "planner.calibration": ("{run}/none.toml", "the planner (meshrun plan --estimate)"),
    "planner.expert_imbalance": ("2", "the planner (meshrun plan --estimate)"),
}

VOLATILE = ("ms", "_s", "mfu", "elapsed", "rss", "kernel", "time", "host", "wait", "seconds", "bytes_per_s", "tok")


def steady(record):
    return {k: v for k, v in record.items() if not any(p in k for p in VOLATILE)}


def run(name, sets, ranks, signal=None):
    """Runs meshrun-train in its own directory; returns (fingerprint, output text)."""
    d = os.path.join(WORK, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    values = dict(BASE)
    values["checkpoint.save"] = "{run}/final.safetensors"
    values.update(sets)
    args = []
    for k, v in values.items():
        if "{prepared}" in v:
            shutil.copytree(os.path.join(WORK, "prepared"), os.path.join(d, "prepared"))
            v = v.replace("{prepared}", "{run}/prepared")
        v = v.replace("{valid}", os.path.join(WORK, "corpus.bin"))
        args += ["--set", f"{k}={v.replace('{run}', d)}"]
    cmd = [MPIRUN, "--oversubscribe", "--allow-run-as-root", "--mca", "mpi_yield_when_idle", "1", "-np", str(ranks),
           TRAIN, os.path.join(TEMPLATES, "tiny.toml"), "--trace", os.path.join(d, "trace")] + args
    if signal:  # after the first step record, to mpirun (which forwards SIGUSR1/SIGUSR2 to the ranks)
        proc = subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        metrics = os.path.join(d, "out", "metrics.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if os.path.exists(metrics) and '"record":"step"' in open(metrics).read():
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.send_signal(getattr(signal_module, "SIG" + signal))
        try:
            out_text, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out_text, _ = proc.communicate()
        p = subprocess.CompletedProcess(cmd, proc.returncode, out_text)
    else:
        p = subprocess.run(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    files, steps, records, run_record, weights, placement = [], [], set(), None, None, []
    for root, _, names in os.walk(d):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), d)
            files.append(rel)
            if n.endswith(".jsonl"):
                for line in open(os.path.join(root, n)):
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    records.add(r.get("record"))
                    if r.get("record") == "step":
                        steps.append((r["step"], r["loss"], r["grad_norm"], r.get("lr"), r.get("memory_bytes")))
                    if r.get("record") == "run":
                        run_record = json.dumps(steady(r), sort_keys=True)
            if rel == "trace/trace.json":  # which rank runs which pipeline chunk's work
                t = json.load(open(os.path.join(root, n)))
                events = [e for e in (t["traceEvents"] if isinstance(t, dict) else t)
                          if e.get("ph") == "X" and e.get("cat") != "wait"]
                events.sort(key=lambda e: (e.get("pid"), e.get("ts", 0)))  # each rank's work in its order
                placement = [(e.get("pid"), e.get("name"), json.dumps(e.get("args", {}).get("chunk"))) for e in events]
            if rel == "final.safetensors":
                weights = hashlib.sha256(open(os.path.join(root, n), "rb").read()).hexdigest()
    activations = [l.split("; activations ")[1].split(" MiB")[0] for l in p.stdout.splitlines() if "; activations " in l]
    warnings = sorted({"".join("#" if c.isdigit() else c for c in line) for line in p.stdout.splitlines()
                       if "warning" in line.lower()})
    fp = {"rc": p.returncode, "steps": steps, "records": sorted(map(str, records)), "run": run_record,
          "files": sorted(files), "weights": weights, "warnings": warnings, "placement": placement,
          "activations": activations[:1]}
    return fp, p.stdout


def essence(text):
    """meshrun-train's own lines of an output (mpirun's banners left out)."""
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("-") and "mpirun" not in l
             and "Process name" not in l and "Exit code" not in l and "Primary job" not in l
             and "a non-zero exit code" not in l and "the job to be terminated" not in l]
    return " | ".join(lines[-4:])[-500:]


def differences(a, b, with_run=False):
    """The parts of two fingerprints that differ; the run record (an echo of the settings) only on request."""
    return [k for k in a if a[k] != b[k] and (with_run or k != "run")]


def main():
    keys = subprocess.run([KEYS_BIN], stdout=subprocess.PIPE, text=True, check=True).stdout.split("\n")
    keys = [line.split()[0] for line in keys if line.strip()]
    fail = 0

    def bad(msg):
        nonlocal fail
        fail = 1
        print("FAIL " + msg)

    for k in keys:
        if (k in PROBES) == (k in ELSEWHERE):
            bad(f"{k}: in {'both tables' if k in PROBES else 'neither table'} (give it a probe or name its reader)")
    for k in list(PROBES) + list(ELSEWHERE):
        if k not in keys:
            bad(f"{k}: in the walk's table but not in the schema")
    # A checkpoint to resume from (step 2 of the baseline), for checkpoint.resume.
    fp, text = run("prepare", {"checkpoint.dir": "{run}/ck", "checkpoint.interval": "2", "training.steps": "2",
                               "training.lr_decay_steps": "3"}, 1)
    if fp["rc"] != 0:
        bad("preparing a checkpoint failed:\n" + text[-800:])
        return 1
    shutil.copytree(os.path.join(WORK, "prepare", "ck"), os.path.join(WORK, "prepared"))

    references = {}

    def reference(extra, ranks, signal=None):
        key = (json.dumps(extra, sort_keys=True), ranks, signal)
        if key not in references:
            references[key] = run(f"ref-{len(references)}", extra, ranks, signal)
        return references[key]

    base, base_text = reference({}, 1)
    if base["rc"] != 0 or len(base["steps"]) != 3:
        bad("the baseline did not train 3 steps:\n" + base_text[-800:])
        return 1
    print(f"baseline: 3 steps, losses {', '.join('%.4f' % s[1] for s in base['steps'])}")
    for k in keys:
        if k not in PROBES:
            continue
        value, extra, ranks, expect = PROBES[k][:4]
        sig = PROBES[k][4] if len(PROBES[k]) > 4 else None
        if expect.startswith("covered"):
            print(f"ok   {k}: {expect}")
            continue
        ref, ref_text = reference(extra, ranks, sig)
        if ref["rc"] != 0 and not sig:
            bad(f"{k}: the reference run (default {k}, with {extra} on {ranks} ranks) failed:\n" + essence(ref_text))
            continue
        fp, text = run("probe-" + k, dict(extra, **{k: value}), ranks, sig)
        if expect.startswith("refused"):
            want = expect.split(":", 1)[1].strip()
            line = essence(text)
            if fp["rc"] == 2 and want in text:
                print(f"ok   {k} = {value}: refused, exit 2: {line[:150]}")
            else:
                bad(f"{k} = {value}: expected exit 2{' with ' + repr(want) if want else ''}, got exit {fp['rc']}: "
                    f"{essence(text)}")
            continue
        if expect.startswith("log:"):
            want = expect.split(":", 1)[1].strip()
            if fp["rc"] == 0 and want in text and want not in ref_text:
                print(f"ok   {k} = {value}: its output says '{want}', the default's does not")
            else:
                bad(f"{k} = {value}: expected '{want}' in its output and not in the default's (exit {fp['rc']}): {essence(text)}")
            continue
        if expect == "reported":
            if fp["rc"] == 0 and differences(fp, ref, True) == ["run"]:
                print(f"ok   {k} = {value}: a label, in the run record (the numbers unchanged)")
            else:
                bad(f"{k} = {value}: expected only the run record to change, got {differences(fp, ref, True)}")
            continue
        if fp["rc"] != 0 and not sig:
            bad(f"{k} = {value}: the run failed (exit {fp['rc']}): {essence(text)}")
            continue
        diff = differences(fp, ref)
        if diff:
            print(f"ok   {k} = {value}: changes {', '.join(diff)}")
        else:
            bad(f"{k} = {value}: accepted and ignored (the run's fingerprint equals the default's)")
    # The negative case: a probe whose value is the reference's own (tiny's lr) must be judged ignored.
    same, _ = run("negative-lr", {"training.lr": "0.003"}, 1)
    if differences(same, base):
        bad(f"negative: training.lr = 0.003 (tiny's own) judged as changing {differences(same, base)}: the judge cannot fail")
    else:
        print("ok   negative: training.lr = 0.003, tiny's own value, has the default's fingerprint (judged ignored)")
    for k in keys:
        if k not in ELSEWHERE:
            continue
        value, reader = ELSEWHERE[k]
        fp, text = run("elsewhere-" + k, {k: value}, 1)
        if fp["rc"] == 2:
            print(f"ok   {k} = {value}: read by {reader}; meshrun-train refuses this value: "
                  f"{essence(text)[:160]}")
        elif fp["rc"] == 0 and fp["steps"] == base["steps"] and fp["weights"] == base["weights"]:
            print(f"ok   {k} = {value}: read by {reader}; meshrun-train trains the baseline's numbers")
        else:
            bad(f"{k} = {value}: listed as read by {reader}, but meshrun-train's run differs "
                f"(exit {fp['rc']}, {', '.join(differences(fp, base))}): {essence(text)}")
    print(f"schema walk: {len(keys)} keys, {len(PROBES)} read by meshrun-train, {len(ELSEWHERE)} elsewhere: "
          + ("all passed" if not fail else "FAILED"))
    return fail


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        if not os.environ.get("KEEP"):
            shutil.rmtree(WORK, ignore_errors=True)
