#!/usr/bin/env python3
"""The Split pre-tokenizer's five behaviors against the Rust tokenizers library's own test cases.

The JavaScript port that tokenizer.oracle compares with treats every behavior but Removed as Isolated (and keeps
only the matches under invert), so these cases come from the Rust library's source instead
(huggingface/tokenizers 3ba8ad00: tokenizers/src/tokenizer/normalizer.rs `fn split`, splitting
"The-final--countdown" on '-'; tokenizers/src/pre_tokenizers/split.rs `fn basic`, the regex \\w+|[^\\w\\s]+ with
invert on "How are you doing?"). For each case a small BPE tokenizer.json (the characters, and merges learned
over the texts and the pieces, which cross the pieces' borders) encodes the text with the Split pre-tokenizer; the
ids must equal those of encoding each of Rust's expected pieces alone with no pre-tokenizer, since BPE works
within a piece. A wrong cut changes the ids: the check is shown to fail on the Isolated pieces for every other
behavior.
usage: split_behaviors.py MESHRUN_TOKENIZE
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

TOKENIZE = sys.argv[1]
DIR = tempfile.mkdtemp(prefix="meshrun-split-")
failures = 0

CASES = [  # (pattern, invert, text, {behavior: Rust's pieces})
    ({"String": "-"}, False, "The-final--countdown", {
        "Removed": ["The", "final", "countdown"],
        "Isolated": ["The", "-", "final", "-", "-", "countdown"],
        "MergedWithPrevious": ["The-", "final-", "-", "countdown"],
        "MergedWithNext": ["The", "-final", "-", "-countdown"],
        "Contiguous": ["The", "-", "final", "--", "countdown"],
    }),
    ({"Regex": r"\w+|[^\w\s]+"}, True, "How are you doing?", {
        "Removed": ["How", "are", "you", "doing", "?"],
        "Isolated": ["How", " ", "are", " ", "you", " ", "doing", "?"],
        "MergedWithPrevious": ["How ", "are ", "you ", "doing", "?"],
        "MergedWithNext": ["How", " are", " you", " doing", "?"],
        "Contiguous": ["How", " ", "are", " ", "you", " ", "doing?"],
    }),
]


def bpe(texts, n_merges):
    """characters and the most frequent pairs over the whole texts (no pre-tokenization: merges cross borders)"""
    vocab = {c: i for i, c in enumerate(sorted({c for t in texts for c in t}))}
    seqs = [list(t) for t in texts]
    merges = []
    for _ in range(n_merges):
        pairs = collections.Counter((a, b) for s in seqs for a, b in zip(s, s[1:]))
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append([a, b])  # pairs: the tokens hold spaces
        vocab.setdefault(a + b, len(vocab))
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i:i + 2] = [a + b]
                i += 1
    return vocab, merges


def tokenizer(vocab, merges, pre_tokenizer):
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": merges}}


def encode(tok, text, name):
    path = os.path.join(DIR, name)
    with open(path + ".json", "w", encoding="utf-8") as f:
        json.dump(tok, f)
    with open(path + ".txt", "w", encoding="utf-8", newline="") as f:
        f.write(text)
    p = subprocess.run([TOKENIZE, path + ".ids", path + ".txt", "--tokenizer", path + ".json", "--format", "raw",
                        "--dtype", "uint32"], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        return None, (p.stdout + p.stderr).strip()
    data = open(path + ".ids", "rb").read()
    return [int.from_bytes(data[i:i + 4], "little") for i in range(0, len(data), 4)], ""


# Merges over the texts and over every expected piece, until each piece is one token: different cuts give
# different ids, and merges across borders exist for a wrong cut to use.
vocab, merges = bpe([c[2] for c in CASES] + [p for c in CASES for pieces in c[3].values() for p in pieces], 400)
plain = tokenizer(vocab, merges, None)
for ci, (pattern, invert, text, expected) in enumerate(CASES):
    piece_ids = {}  # every expected piece encoded alone, with no pre-tokenizer
    for piece in sorted({p for pieces in expected.values() for p in pieces}):
        ids, err = encode(plain, piece, f"piece{ci}-{len(piece_ids)}")
        if ids is None:
            failures += 1
            print(f"FAIL encoding the piece {piece!r} alone: {err}")
        piece_ids[piece] = ids or []
    for behavior, pieces in expected.items():
        want = [i for piece in pieces for i in piece_ids[piece]]
        split = {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
        got, err = encode(tokenizer(vocab, merges, split), text, f"case{ci}-{behavior}")
        name = f"Split {json.dumps(pattern)} invert={invert} {behavior} on {text!r}"
        if got == want:
            print(f"ok   {name}: {pieces}")
        else:
            failures += 1
            print(f"FAIL {name}: ids {got} {err}, Rust's pieces {pieces} give {want}")
        if behavior != "Isolated":  # the check can fail: the Isolated cut is told apart
            iso = [i for piece in expected["Isolated"] for i in piece_ids[piece]]
            if iso == want and expected["Isolated"] != pieces:
                failures += 1
                print(f"FAIL {name}: the Isolated pieces give the same ids; the check cannot tell the cuts apart")

bad = tokenizer(vocab, merges, {"type": "Split", "pattern": {"String": "-"}, "behavior": "Merged", "invert": False})
got, err = encode(bad, "a-b", "unknown-behavior")
if got is None and "pre-tokenizer Split behavior 'Merged' is unknown" in err and err.count("\n") == 0:
    print(f"ok   an unknown behavior is refused in one line: {err}")
else:
    failures += 1
    print(f"FAIL an unknown behavior: {got} {err}")
print(f"{'FAIL' if failures else 'ok'}: {failures} failure(s)")
sys.exit(1 if failures else 0)
