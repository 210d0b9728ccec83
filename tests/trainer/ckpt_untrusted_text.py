#!/usr/bin/env python3
"""meshrun-ckpt echoes what a checkpoint says (tensor names, the layout's order, paths) only as printable text.

A hand-written manifest (no shard is read by `inspect` without --verify) whose tensor name holds an OSC title
sequence, BEL, a clear-screen CSI and a newline; one whose name also holds a byte that is not UTF-8 and
whose shape is refused (the error echoes the name); and a positive case: "é" and "…" are printed as they are.
usage: ckpt_untrusted_text.py MESHRUN_CKPT
"""
import json
import os
import subprocess
import sys
import tempfile

ckpt = sys.argv[1]
failures = 0


def check(name, ok, detail):
    global failures
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
    failures += 0 if ok else 1


def write_checkpoint(root, tensor_name, shape, order="tp-cp-ep-dp-pp"):
    os.makedirs(root, exist_ok=True)
    manifest = {"format": "meshrun-checkpoint", "version": 1, "step": 3, "dtype": "F32", "consumed_samples": 48,
                "layout": {"tp": 1, "cp": 1, "pp": 1, "dp": 1, "ep": 1, "virtual_stages": 1, "zero_stage": 0,
                           "sequence_parallel": False, "order": order},
                "training": {"global_batch_size": 16},
                "tensors": [{"name": "embed.weight", "shape": [8, 4]}, {"name": tensor_name, "shape": shape}],
                "files": [{"file": "rank-00000.safetensors", "rank": 0, "bytes": 0, "pieces": [
                    {"tensor": t, "kind": k, "key": t, "hash": "0", "block": [0, 0, s[0], s[1] if len(s) > 1 else 1],
                     "range": [0, s[0] * (s[1] if len(s) > 1 else 1)]}
                    for t, s in (("embed.weight", [8, 4]), (tensor_name, shape)) if all(d > 0 for d in s)
                    for k in ("param", "exp_avg", "exp_avg_sq")]}]}
    text = json.dumps(manifest, ensure_ascii=True)  # \u001b etc. in the JSON text: the parser decodes them
    with open(os.path.join(root, "manifest.json"), "wb") as f:
        f.write(text.encode())


def run(*args):
    p = subprocess.run([ckpt, *args], capture_output=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def controls(b):
    return sorted({c for c in b if c < 0x20 and c != 0x0A or c == 0x7F})


with tempfile.TemporaryDirectory() as tmp:
    evil = "wte\u001b]0;owned\u0007\u001b[2J\nfake line"
    d = os.path.join(tmp, "escape")
    write_checkpoint(d, evil, [8, 4], order="tp-cp-ep-dp-pp\u001b[31m")
    rc, out, err = run("inspect", d)
    lines = out.decode("utf-8", "strict").splitlines()
    check("inspect: exit 0", rc == 0, f"rc={rc} stderr={err[:300]!r}")
    check("inspect: no control byte on stdout", controls(out) == [], f"control bytes {controls(out)} in {out[:600]!r}")
    check("inspect: the name is shown escaped on its own line",
          any(l.strip().startswith(r"wte\x1b]0;owned\x07\x1b[2J\nfake line") for l in lines), f"stdout {out[:600]!r}")
    check("inspect: no line of the name is split off", not any(l.startswith("fake line") for l in lines), repr(lines))
    check("inspect: the layout's order is shown escaped", any(r"order=tp-cp-ep-dp-pp\x1b[31m" in l for l in lines),
          repr(lines))

    # A refused shape: the error echoes the name (manifest.cpp); the top-level catch keeps it one printable line.
    d = os.path.join(tmp, "bad")
    write_checkpoint(d, "w\u001b[2J\nx", [0])
    rc, out, err = run("inspect", d)
    check("bad shape: exit 2", rc == 2, f"rc={rc} stderr={err[:300]!r}")
    check("bad shape: one line on stderr", err.count(b"\n") == 1 and err.startswith(b"meshrun-ckpt: "), repr(err[:600]))
    check("bad shape: no control byte on stderr", controls(err) == [], f"{controls(err)} in {err[:600]!r}")
    check("bad shape: the name is shown escaped", b"tensor w\\x1b[2J\\nx" in err, repr(err[:600]))

    # A damaged manifest: a byte that is not UTF-8 (0xff) in a name; the JSON parser's error echoes it.
    with open(os.path.join(d, "manifest.json"), "rb") as f:
        raw = f.read()
    with open(os.path.join(d, "manifest.json"), "wb") as f:
        f.write(raw.replace(b"w\\u001b", b"w\xff\\u001b"))
    rc, out, err = run("inspect", d)
    check("invalid UTF-8: exit 2, one line", rc == 2 and err.count(b"\n") == 1, f"rc={rc} stderr={err[:600]!r}")
    check("invalid UTF-8: stderr is valid UTF-8", err.decode("utf-8", "replace").encode() == err, repr(err[:600]))
    check("invalid UTF-8: the byte is shown as \\xff", b"\\xff" in err, repr(err[:600]))

    # Positive: valid UTF-8 such as "é" and "…" is printed unchanged.
    d = os.path.join(tmp, "utf8")
    write_checkpoint(d, "café…weight", [8, 4])
    rc, out, err = run("inspect", d)
    check("utf-8: exit 0 and the name unchanged", rc == 0 and "café…weight" in out.decode("utf-8", "replace"),
          f"rc={rc} stdout={out[:600]!r} stderr={err[:300]!r}")

print(f"{failures} failures")
sys.exit(1 if failures else 0)
