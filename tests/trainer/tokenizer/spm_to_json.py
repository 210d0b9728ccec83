#!/usr/bin/env python3
"""Writes a Hugging Face tokenizer.json (BPE with byte fallback) from a SentencePiece BPE .model, laid out as
transformers' LlamaConverter lays out Llama 2's (merges from SentencePieceExtractor: every split of a piece
into two pieces, ranked by the piece's score), so the tests have a byte-fallback BPE tokenizer.json
without downloading one.

usage: spm_to_json.py MODEL OUT.json llama2|metaspace

llama2:    normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, TemplateProcessing "<s> $A",
           decoder Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0).
metaspace: no normalizer, pre-tokenizer Sequence[Metaspace(prepend_scheme "first"), Digits(individual)],
           decoder Sequence[ByteFallback, Fuse, Metaspace].
"""
import json
import sys

import sentencepiece as spm

model, out, layout = sys.argv[1:4]
sp = spm.SentencePieceProcessor(model_file=model)
vocab, scores, added = {}, {}, []
for i in range(sp.get_piece_size()):
    piece = sp.id_to_piece(i)
    vocab[piece] = i
    if sp.is_control(i) or sp.is_unknown(i):
        added.append({"id": i, "content": piece, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
    elif not sp.is_byte(i):
        scores[piece] = sp.get_score(i)
merges = []
for piece, score in scores.items():
    local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
             if piece[:k] in scores and piece[k:] in scores]
    merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
merges.sort(key=lambda m: m[2], reverse=True)

tok = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": added,
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
              "vocab": vocab, "merges": [f"{a} {b}" for a, b, _ in merges]},
}
if layout == "llama2":
    tok["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    tok["pre_tokenizer"] = None
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [vocab["<s>"]], "tokens": ["<s>"]}}}
    tok["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
elif layout == "metaspace":
    tok["normalizer"] = None
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "Digits", "individual_digits": True}]}
    tok["post_processor"] = None
    tok["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}]}
else:
    sys.exit(f"spm_to_json.py: layout {layout} is unknown (llama2, metaspace)")
with open(out, "w", encoding="utf-8") as f:
    json.dump(tok, f, ensure_ascii=False)
