#!/usr/bin/python3
# The reference side of bench/cpu_bench.sh (not a test): the training step of meshrun-train's model in
# PyTorch on one thread: Llama-style decoder (RMSNorm, RoPE, grouped-query causal attention, SwiGLU,
# untied head), cross-entropy, gradient accumulation over micro-batches, clipping, AdamW; fp32.
# Prints one line: the median ms per step over the steps after the first.
# usage: bench/torch_step.py LAYERS HIDDEN FFN HEADS KV_HEADS VOCAB SEQ BATCH MICRO STEPS [DEVICE]
# DEVICE cuda (bench/gpu/train_check.sh): the same step on the GPU as meshrun's CUDA backend keeps it, fp32
# parameters, gradients and AdamW moments with the matmuls and attention in bf16 (torch.autocast), attention
# through scaled_dot_product_attention (causal, grouped-query: PyTorch's fused flash kernel), fused AdamW;
# timed between torch.cuda.synchronize() calls. Default cpu: fp32 on one thread (bench/cpu_bench.sh).
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

L, H, FF, NH, NKV, V, S, B, MB, STEPS = (int(a) for a in sys.argv[1:11])
DEVICE = sys.argv[11] if len(sys.argv) > 11 else "cpu"
if DEVICE not in ("cpu", "cuda"):
    sys.exit(f"torch_step.py: DEVICE must be cpu or cuda, not {DEVICE!r}")
GPU = DEVICE == "cuda"
if GPU and not torch.cuda.is_available():
    sys.exit("torch_step.py: DEVICE cuda, but torch.cuda.is_available() is False")
if not GPU:
    torch.set_num_threads(1)
D = H // NH


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.Parameter(torch.ones(H))
        self.q = torch.nn.Linear(H, NH * D, bias=False)
        self.k = torch.nn.Linear(H, NKV * D, bias=False)
        self.v = torch.nn.Linear(H, NKV * D, bias=False)
        self.o = torch.nn.Linear(NH * D, H, bias=False)
        self.ln2 = torch.nn.Parameter(torch.ones(H))
        self.gate = torch.nn.Linear(H, FF, bias=False)
        self.up = torch.nn.Linear(H, FF, bias=False)
        self.down = torch.nn.Linear(FF, H, bias=False)


def rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x, cos, sin):  # Hugging Face rotate_half
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, H)
        self.layers = torch.nn.ModuleList(Layer() for _ in range(L))
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.head = torch.nn.Linear(H, V, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D))
        ang = torch.outer(torch.arange(S).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = ang.cos(), ang.sin()
        self.mask = torch.full((S, S), float("-inf")).triu(1)

    def forward(self, ids, targets):
        b = ids.shape[0]
        x = self.embed(ids)
        for l in self.layers:
            h = rmsnorm(x, l.ln1)
            q = l.q(h).view(b, S, NH, D).transpose(1, 2)
            k = l.k(h).view(b, S, NKV, D).transpose(1, 2)
            v = l.v(h).view(b, S, NKV, D).transpose(1, 2)
            q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
            if GPU:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                k = k.repeat_interleave(NH // NKV, dim=1)
                v = v.repeat_interleave(NH // NKV, dim=1)
                att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + self.mask, dim=-1)
                a = att @ v
            x = x + l.o(a.transpose(1, 2).reshape(b, S, H))
            h = rmsnorm(x, l.ln2)
            x = x + l.down(F.silu(l.gate(h)) * l.up(h))
        logits = self.head(rmsnorm(x, self.norm))
        return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="sum")


torch.manual_seed(1)
model = Model().to(DEVICE)
model.cos, model.sin, model.mask = model.cos.to(DEVICE), model.sin.to(DEVICE), model.mask.to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, **({"fused": True} if GPU else {}))
data = torch.randint(0, V, (B, S + 1), device=DEVICE)
times = []
for step in range(STEPS):
    if GPU:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    for m in range(0, B, MB):
        chunk = data[m : m + MB]
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=GPU):
            loss = model(chunk[:, :-1], chunk[:, 1:]) / (B * S)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if GPU:
        torch.cuda.synchronize()
    times.append((time.perf_counter() - t0) * 1000.0)
print(f"{statistics.median(times[1:]):.3f}")
