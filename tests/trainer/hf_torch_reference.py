#!/usr/bin/env python3
"""An independent PyTorch Llama / Mixtral forward that reads ONLY a Hugging Face model directory (config.json
and safetensors, parsed here by hand) and computes the mean next-token cross-entropy of a batch of a raw token
file, as meshrun-train's step 1 does (unshuffled: sequence i is tokens [i*S, i*S+S], its targets one later).

The semantics are transformers' (src/transformers/models/llama/modeling_llama.py, mixtral/modeling_mixtral.py;
docs/trainer.md cites them): LlamaRMSNorm (mean of squares in float32, x * rsqrt(var + eps), then weight *),
rotary embedding with inv_freq = 1 / rope_theta^(arange(0, d, 2) / d), cos/sin of cat(freqs, freqs) and
rotate_half (element i pairs with i + d/2), grouped-query attention by repeat_kv (query head h reads kv head
h // (heads / kv_heads)), causal softmax(q k^T / sqrt(d)) v, o_proj, residuals, SwiGLU MLP down(silu(gate(x)) *
up(x)); Mixtral: router logits = gate(x), softmax in float, top-k, weights renormalised to sum 1, experts
w2(silu(w1(x)) * w3(x)) summed with those weights; final norm, lm_head (or the embedding when
tie_word_embeddings). Computed in float64.

usage: hf_torch_reference.py DIR TOKENS.bin --seq-len S --batch B [--token-dtype uint16|uint32]
                             [--expect LOSS --rel 1e-5 | --expect-differ LOSS --rel 1e-5]
prints "loss <value>"; with --expect exits 1 unless |loss - LOSS| <= rel * |LOSS| (--expect-differ: unless it
is farther than that).
"""
import argparse
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    payload = memoryview(blob)[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(payload[b:end]), dtype=DTYPES[e["dtype"]]).reshape(e["shape"])
        out[name] = t.to(torch.float64)
    return out


def read_model_dir(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        weight_map = json.load(open(index))["weight_map"]
        for f in sorted(set(weight_map.values())):
            weights.update(read_safetensors(os.path.join(d, f)))
        missing = set(weight_map) - set(weights)
        if missing:
            sys.exit("index names tensors no shard holds: %s" % sorted(missing)[:3])
    else:
        weights = read_safetensors(os.path.join(d, "model.safetensors"))
    return cfg, weights


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(cfg, W, ids):
    """ids: [B, S] int64 -> logits [B, S, V]."""
    if cfg.get("rope_scaling") is not None:
        sys.exit("rope_scaling is not implemented by this reference")
    B, S = ids.shape
    H, L = cfg["hidden_size"], cfg["num_hidden_layers"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or H // nh
    eps = cfg["rms_norm_eps"]
    theta = cfg.get("rope_theta", 10000.0)
    moe = cfg["model_type"] == "mixtral"
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).double() / hd))
    pos = torch.arange(S, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None, None], emb.sin()[None, None]  # [1, 1, S, hd]
    causal = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)

    x = W["model.embed_tokens.weight"][ids]
    for l in range(L):
        p = "model.layers.%d." % l
        r = x
        xn = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = (xn @ W[p + "self_attn.q_proj.weight"].T).view(B, S, nh, hd).transpose(1, 2)
        k = (xn @ W[p + "self_attn.k_proj.weight"].T).view(B, S, nkv, hd).transpose(1, 2)
        v = (xn @ W[p + "self_attn.v_proj.weight"].T).view(B, S, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv  # repeat_kv
        k = k[:, :, None].expand(B, nkv, rep, S, hd).reshape(B, nh, S, hd)
        v = v[:, :, None].expand(B, nkv, rep, S, hd).reshape(B, nh, S, hd)
        att = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hd) + causal, dim=-1) @ v
        att = att.transpose(1, 2).reshape(B, S, nh * hd)
        x = r + att @ W[p + "self_attn.o_proj.weight"].T
        r = x
        xn = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        if moe:
            E, K = cfg["num_local_experts"], cfg["num_experts_per_tok"]
            flat = xn.reshape(-1, H)
            probs = torch.softmax(flat @ W[p + "block_sparse_moe.gate.weight"].T, dim=-1)
            wts, sel = torch.topk(probs, K, dim=-1)
            wts = wts / wts.sum(dim=-1, keepdim=True)
            y = torch.zeros_like(flat)
            for e in range(E):
                ep = p + "block_sparse_moe.experts.%d." % e
                rows, slot = torch.where(sel == e)
                if rows.numel() == 0:
                    continue
                xe = flat[rows]
                he = torch.nn.functional.silu(xe @ W[ep + "w1.weight"].T) * (xe @ W[ep + "w3.weight"].T)
                y.index_add_(0, rows, (he @ W[ep + "w2.weight"].T) * wts[rows, slot][:, None])
            x = r + y.view(B, S, H)
        else:
            g = torch.nn.functional.silu(xn @ W[p + "mlp.gate_proj.weight"].T)
            u = xn @ W[p + "mlp.up_proj.weight"].T
            x = r + (g * u) @ W[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("tokens")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--token-dtype", default="uint16")
    ap.add_argument("--expect", type=float)
    ap.add_argument("--expect-differ", type=float)
    ap.add_argument("--rel", type=float, default=1e-5)
    a = ap.parse_args()
    cfg, W = read_model_dir(a.dir)
    width = 2 if a.token_dtype == "uint16" else 4
    raw = open(a.tokens, "rb").read((a.batch * a.seq_len + 1) * width)
    toks = torch.tensor(struct.unpack("<%d%s" % (len(raw) // width, "H" if width == 2 else "I"), raw), dtype=torch.int64)
    S = a.seq_len
    ids = torch.stack([toks[i * S:i * S + S] for i in range(a.batch)])
    targets = torch.stack([toks[i * S + 1:i * S + S + 1] for i in range(a.batch)])
    with torch.no_grad():
        logits = forward(cfg, W, ids)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).item()
    print("loss %r" % loss)
    if a.expect is not None:
        rel = abs(loss - a.expect) / abs(a.expect)
        print("meshrun %r, relative difference %.3g (bound %g)" % (a.expect, rel, a.rel))
        return 0 if rel <= a.rel else 1
    if a.expect_differ is not None:
        rel = abs(loss - a.expect_differ) / abs(a.expect_differ)
        print("meshrun %r, relative difference %.3g (must exceed %g)" % (a.expect_differ, rel, a.rel))
        return 0 if rel > a.rel else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
