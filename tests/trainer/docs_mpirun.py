#!/usr/bin/env python3
"""Every mpirun command in README.md and docs/*.md runs as shown, as root, on a 2-core machine (issue 47 item 2).

Open MPI refuses root without --allow-run-as-root and more ranks than cores without --oversubscribe, so a
command that starts a program under mpirun must carry both (a description such as `mpirun -np WORLD` or
`mpirun -np 8` in a test table starts nothing and is not held to it). Of those, each whose program is a
build/ path and that has no placeholder (`[...]`, `…`, `<pid>`, `t.toml`, `=Z`) is run from a scratch
directory holding this checkout's build/ and templates/ as shown, except that a meshrun-train command gets
`--set training.steps=2` (the rule is about starting, not about 60 steps), and must exit 0.

usage: docs_mpirun.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

SRC, BUILD = sys.argv[1], sys.argv[2]
FLAGS = ("--allow-run-as-root", "--oversubscribe")
PLACEHOLDERS = ("[", "…", "...", "<", "t.toml", "=Z")
fails = 0


def bad(msg):
    global fails
    fails += 1
    print("FAIL " + msg)


def commands(path):
    """(line, command) for each mpirun command: fenced shell lines (with \\ continuations) and inline code."""
    text = open(path, encoding="utf-8").read()
    out, fenced, lines = [], False, text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.lstrip().startswith("mpirun "):
            start, cmd = i + 1, line.strip()
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            out.append((start, re.sub(r"\s+#.*$", "", cmd)))
        i += 1
    # Inline code (a span may wrap onto the next line); code blocks are blanked first.
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for m in re.finditer(r"`(mpirun [^`]*)`", prose):
        out.append((prose.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())))
    return out


def starts_a_program(cmd):
    words = cmd.split()[1:]
    return any("meshrun" in w for w in words)


scratch = tempfile.mkdtemp(prefix="meshrun-docs-mpirun-")
os.symlink(os.path.abspath(BUILD), os.path.join(scratch, "build"))
os.symlink(os.path.join(os.path.abspath(SRC), "templates"), os.path.join(scratch, "templates"))
env = dict(os.environ, MESHRUN_CACHE_DIR=os.path.join(scratch, "cache"))
docs = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(SRC, "docs")) if f.endswith(".md"))
checked = ran = 0
for doc in docs:
    for line, cmd in commands(os.path.join(SRC, doc)):
        if not starts_a_program(cmd):
            continue
        checked += 1
        where = f"{doc}:{line}"
        missing = [f for f in FLAGS if f not in cmd.split()]
        if missing:
            bad(f"{where}: `{cmd}` lacks {' and '.join(missing)}: as root on 2 cores mpirun refuses it")
            continue
        program = next(w for w in cmd.split()[1:] if "meshrun" in w)
        if not program.startswith("build/") or any(p in cmd for p in PLACEHOLDERS):
            print(f"ok   {where}: flags present (not run: placeholder or a program on PATH)")
            continue
        run = cmd + (" --set training.steps=2" if program.endswith("meshrun-train") else "")
        r = subprocess.run(["bash", "-c", run], cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
        ran += 1
        if r.returncode != 0:
            bad(f"{where}: `{run}` exited {r.returncode}: {(r.stdout + r.stderr).strip()[-400:]}")
        else:
            print(f"ok   {where}: `{run}` ran, exit 0")
print(f"{checked} mpirun commands checked, {ran} run")
if checked < 10 or ran < 4:  # the extraction itself must keep finding them
    bad(f"only {checked} commands found and {ran} run; the extraction no longer matches the docs")
subprocess.run(["rm", "-rf", scratch])
sys.exit(1 if fails else 0)
