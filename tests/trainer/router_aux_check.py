#!/usr/bin/env python3
"""The "hf" load-balancing loss against an independent implementation (docs/trainer.md, "Mixture of experts").

Runs router_aux_dump (one fp64 step, 2 micro-batches, 3 MoE layers, 4 experts, top-2), then recomputes from its
router logits, in plain Python:
  * Hugging Face Mixtral's load_balancing_loss_func (transformers, models/mixtral/modeling_mixtral.py, no
    attention mask): concatenate the layers' logits, softmax, top-k, one-hot [L·T, k, E]; tokens_per_expert =
    its mean over the L·T rows ([k, E]); router_prob_per_expert = the mean probability [E];
    num_experts · Σ(tokens_per_expert · router_prob_per_expert), times MixtralConfig's default
    router_aux_loss_coef 0.001, averaged over the step's micro-batches (one forward each);
  * meshrun's convention: per layer E · Σᵢ (cᵢ/(T·k))·(Pᵢ/T), summed over layers, coefficient 0.01.
Each must equal the trainer's aux_loss within 1e-12 relative (fp64; only the summation order differs).
Negative: HF's formula computed per layer and summed (not pooled), and HF's without the k slots summed
(meshrun's 1/k), each miss the trainer's "hf" value by far more than the bound.
usage: router_aux_check.py ROUTER_AUX_DUMP
"""
import math
import subprocess
import sys
import tempfile

BOUND = 1e-12


def softmax(row):
    m = max(row)
    e = [math.exp(x - m) for x in row]
    s = sum(e)
    return [x / s for x in e]


def top_k(p, k):  # indices of the k largest probabilities (random logits: no ties)
    return sorted(range(len(p)), key=lambda i: -p[i])[:k]


def hf_load_balancing_loss(layers_logits, E, k):
    rows = [softmax(r) for layer in layers_logits for r in layer]  # torch.cat over layers, softmax
    n = len(rows)
    tokens_per_expert = [[0.0] * E for _ in range(k)]  # mean over rows of one_hot(selected) [k, E]
    for p in rows:
        for slot, i in enumerate(top_k(p, k)):
            tokens_per_expert[slot][i] += 1.0 / n
    router_prob = [sum(p[i] for p in rows) / n for i in range(E)]
    return E * sum(tokens_per_expert[s][i] * router_prob[i] for s in range(k) for i in range(E))


def meshrun_per_layer(layer_logits, E, k):
    rows = [softmax(r) for r in layer_logits]
    T = len(rows)
    c = [0] * E
    for p in rows:
        for i in top_k(p, k):
            c[i] += 1
    return E * sum((c[i] / (T * k)) * (sum(p[i] for p in rows) / T) for i in range(E))


def main():
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        subprocess.run([sys.argv[1], out.name], check=True)
        lines = open(out.name).read().splitlines()
    head = lines[0].split()
    meta = {head[i]: int(head[i + 1]) for i in range(0, len(head), 2)}
    E, k, L, M, T = meta["experts"], meta["top_k"], meta["layers"], meta["microbatches"], meta["tokens"]
    aux_hf = float(lines[1].split()[1])
    aux_meshrun = float(lines[2].split()[1])
    logits = {}
    for line in lines[3:]:
        f = line.split()
        mb, layer, v = int(f[1]), int(f[2]), [float(x) for x in f[3:]]
        assert len(v) == T * E, (len(v), T, E)
        logits[(mb, layer)] = [v[r * E:(r + 1) * E] for r in range(T)]
    assert M == 2 and len(logits) == M * L, (M, L, len(logits))
    per_mb = [[logits[(m, l)] for l in range(L)] for m in range(M)]

    fails = 0

    def check(what, got, want, expect_far=False):
        nonlocal fails
        rel = abs(got - want) / abs(want)
        ok = rel > 1000 * BOUND if expect_far else rel <= BOUND
        fails += not ok
        print(f"{'ok' if ok else 'FAIL'}   {what}: trainer {got:.17g}, Python {want:.17g}, rel {rel:.1e}"
              + (" (must differ)" if expect_far else f" (bound {BOUND:g})"))

    hf = sum(0.001 * hf_load_balancing_loss(per_mb[m], E, k) for m in range(M)) / M
    check("router_aux = hf (coefficient unset) == HF load_balancing_loss_func x 0.001, mean over micro-batches", aux_hf, hf)
    mr = sum(0.01 * sum(meshrun_per_layer(per_mb[m][l], E, k) for l in range(L)) for m in range(M)) / M
    check("router_aux = meshrun == per-layer E*sum(c/(T*k) * P/T) x 0.01, summed over layers", aux_meshrun, mr)
    not_pooled = sum(0.001 * sum(hf_load_balancing_loss([per_mb[m][l]], E, k) for l in range(L)) for m in range(M)) / M
    check("NEGATIVE HF's formula per layer and summed (not pooled)", aux_hf, not_pooled, expect_far=True)
    check("NEGATIVE HF's formula with meshrun's 1/k", aux_hf, hf / k, expect_far=True)
    print(f"meshrun/hf term ratio at equal coefficients: {(mr / 0.01) / (hf / 0.001):.4f} (L/k = {L / k:.4f} when "
          f"the layers' statistics agree)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
