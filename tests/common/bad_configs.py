#!/usr/bin/env python3
"""One table of bad job configurations (issue 27), each a template derived from templates/tiny.toml (or
tiny-moe.toml) that breaks exactly one rule, with the line every consumer must refuse it with: `meshrun plan`,
`meshrun sbatch --dry-run`, `meshrun run --dry-run`, `meshrun exec … -- meshrun-train`, `meshrun-train` itself
(tests/launcher/bad_configs.sh) and the SPANK plugin (`srun --mesh-template`, tests/slurm/checks.sh).

usage: bad_configs.py TEMPLATES_DIR OUT_DIR   writes OUT_DIR/NAME.toml and prints "NAME<TAB>EXPECTED LINE"
"""
import re
import sys

# name, base template, {section: {key: TOML value}}, the rule's line (the same text in every consumer)
TABLE = [
    ("rope-head-dim", "tiny.toml", {"model": {"hidden": "120", "heads": "8"}},
     "the head dimension model.hidden/model.heads = 15 is odd; rotary embeddings rotate pairs of dimensions: use an even head dimension"),
    ("trainer-mlp", "tiny.toml", {"model": {"mlp": '"gelu"'}},
     'model.mlp = "gelu": meshrun-train builds the Llama SwiGLU MLP; set model.mlp = "swiglu", or set job.trainer = "megatron" (Megatron-LM builds GELU MLPs; its flags: meshrun plan --for megatron)'),
    ("trainer-tied-embeddings", "tiny.toml", {"model": {"tied_embeddings": "true"}},
     'model.tied_embeddings = true: meshrun-train keeps Llama\'s untied LM head; set it to false, or set job.trainer = "megatron" (Megatron-LM ties them; its flags: meshrun plan --for megatron)'),
    ("expert-width-tp", "tiny-moe.toml", {"model": {"moe_ffn_hidden": "129"}, "parallel": {"tp": "2", "ep": "2"}},
     "the expert width (model.moe_ffn_hidden, or ffn_hidden when 0) = 129 is not divisible by tp=2; expert MLPs are split over TP like the dense one: use a tp that divides it"),
    ("router-aux-pp", "tiny-moe.toml", {"model": {"router_aux": '"hf"'}, "parallel": {"pp": "2", "ep": "2"}},
     'model.router_aux = "hf" pools the router statistics over all layers, which meshrun-train does not pass between pipeline stages: use parallel.pp = 1 or model.router_aux = "meshrun"'),
    ("recompute-experts", "tiny-moe.toml", {"training": {"recompute": '"full"'}},
     'training.recompute = "full" with model.experts: meshrun-train does not rerun an expert layer\'s routing and dispatch in the backward; use "selective" (norm outputs and the SwiGLU outputs, the experts\' too) or "none"'),
    ("cp-alltoall", "tiny.toml", {"parallel": {"cp": "2", "cp_comm": '"alltoall"'}},
     'parallel.cp_comm = "alltoall" scatters each rank\'s attention heads over 2 CP ranks, but its heads (model.heads/tp = 2) and kv heads (model.kv_heads/tp = 1) are not both divisible by 2: use "ring" or "allgather", a smaller all-to-all group, or a smaller tp'),
    ("dualpipev-microbatches", "tiny.toml", {"parallel": {"tp": "1", "pp": "2", "pipeline_schedule": '"dualpipev"'}},
     'only 2 micro-batches per step for pipeline_schedule = "dualpipev" at pp=2, which needs at least 2·pp = 4 (one per chunk, as DeepSeek\'s DualPipeV asserts); raise training.global_batch_size or lower micro_batch_size'),
    ("kv-heads-tp", "tiny.toml", {"model": {"kv_heads": "1"}},
     "model.kv_heads=1 is not divisible by tp=2; each TP rank needs whole KV heads (GQA): use tp in {1}"),
    ("layers-pp", "tiny.toml", {"model": {"layers": "5"}, "parallel": {"tp": "1", "pp": "2"}},
     "model.layers=5 cannot be split over pp·virtual_stages = 2·1 = 2 pipeline chunks; use a chunk count that divides the layers (1, 5) or layers+2 (first and last chunk one fewer)"),
    ("data-blend", "tiny.toml", {"data": {"text": '""', "blend": '[[0.0, "/tmp/web"], [0, "/tmp/code"]]'}},
     "data.blend's weights sum to 0, not a positive number; give at least one dataset a positive weight"),
    ("data-source", "tiny.toml", {"data": {"blend": '[[1.0, "/tmp/web"]]'}},
     "data.blend and data.text are both set; the blend replaces data.path: remove one of them"),
    ("eval-valid", "tiny.toml", {"training": {"eval_interval": "10"}},
     "training.eval_interval = 10 needs validation data; set data.valid to a path or a blend, or data.split (or eval_interval = 0)"),
    ("data-split", "tiny.toml", {"data": {"split": '"969,30,x"'}},
     'data.split = "969,30,x": part 3 "x" is not a number; give one to three comma-separated weights >= 0 (train,valid,test), e.g. "969,30,1"'),
]


def derive(text, changes):
    section = None
    out, done = [], set()
    lines = text.splitlines()
    for line in lines:
        m = re.match(r"\s*\[([a-z_]+)\]\s*$", line)
        if m:
            # keys of the section being left that were not there: add them before the next section
            for k, v in changes.get(section, {}).items():
                if (section, k) not in done:
                    out.append(f"{k} = {v}")
                    done.add((section, k))
            section = m.group(1)
        km = re.match(r"\s*([a-z_]+)\s*=", line)
        if km and section in changes and km.group(1) in changes[section]:
            k = km.group(1)
            out.append(f"{k} = {changes[section][k]}")
            done.add((section, k))
            continue
        out.append(line)
    for k, v in changes.get(section, {}).items():
        if (section, k) not in done:
            out.append(f"{k} = {v}")
    return "\n".join(out) + "\n"


def main():
    templates, out = sys.argv[1], sys.argv[2]
    for name, base, changes, line in TABLE:
        text = open(f"{templates}/{base}").read()
        open(f"{out}/{name}.toml", "w").write(derive(text, changes))
        print(f"{name}\t{line}")


if __name__ == "__main__":
    main()
