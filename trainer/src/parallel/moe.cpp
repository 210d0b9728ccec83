#include "meshrun/train/parallel/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;
using kc::Store;

template <class T>
std::int64_t MoeActs<T>::bytes() const {
  std::int64_t b = 0;
  for (const std::vector<T>* v : {&probs, &wts, &aux_grad, &xin, &gate, &up, &hact, &ret, &dout, &dgate, &dup})
    b += static_cast<std::int64_t>(v->capacity() * sizeof(T));
  b += static_cast<std::int64_t>(sel.capacity() * sizeof(std::int32_t));
  for (const std::vector<std::int64_t>* v : {&slot_of, &send_rows, &recv_rows, &recv_counts})
    b += static_cast<std::int64_t>(v->capacity() * sizeof(std::int64_t));
  return b;
}

namespace {

// All-to-all of rows [·, h] with per-rank row counts; returns the bytes sent to other ranks.
template <class T>
std::int64_t exchange_rows(Comm& c, const T* send, const std::vector<std::int64_t>& send_rows, T* recv,
                           const std::vector<std::int64_t>& recv_rows, std::int64_t h) {
  std::vector<std::int64_t> sc(send_rows.size()), rc(recv_rows.size());
  std::int64_t bytes = 0;
  for (std::size_t r = 0; r < sc.size(); ++r) {
    sc[r] = send_rows[r] * h;
    rc[r] = recv_rows[r] * h;
    if (static_cast<int>(r) != c.rank()) bytes += sc[r] * static_cast<std::int64_t>(sizeof(T));
  }
  std::int64_t sn = 0, rn = 0;
  for (std::size_t r = 0; r < sc.size(); ++r) sn += sc[r], rn += rc[r];
  c.all_to_all(host_buf(send, sn), sc.data(), host_buf(recv, rn), rc.data());
  return bytes;
}

// The rows this rank keeps of a full [n, h] buffer (sequence parallel: its contiguous slice).
template <class T>
void local_rows(const TensorParallel& tp, const T* full, T* out) {
  const std::int64_t r0 = tp.gathers() ? tp.tp->rank() * tp.nl : 0;
  std::copy(full + r0 * tp.h, full + (r0 + tp.nl) * tp.h, out);
}

// Calls f(j, s, row0, rows) for every (local expert j, source s) segment of the received rows, in the
// order they were received: source-major, then expert.
template <class F>
void for_segments(const ExpertParallel& ep, const std::vector<std::int64_t>& recv_counts, F&& f) {
  std::int64_t row = 0;
  const int P = ep.ep->size();
  for (int s = 0; s < P; ++s)
    for (int j = 0; j < ep.local; ++j) {
      const std::int64_t c = recv_counts[static_cast<std::size_t>(s) * ep.local + j];
      if (c > 0) f(j, s, row, c);
      row += c;
    }
}

}  // namespace

template <class T>
void moe_forward(const ExpertParallel& ep, const TensorParallel& tp, int layer, const std::vector<TensorSlot>& ts,
                 const T* w, const std::vector<const T*>& experts, const std::vector<TensorSlot>& ets, MoeActs<T>& a,
                 const T* xn, T* out, std::vector<T>& xn_full, std::vector<T>& y_full) {
  const std::int64_t n = tp.n, h = tp.h, f = ep.ffn;
  const int E = ep.experts, K = ep.top_k, P = ep.ep->size();
  const T* x = tp.full_rows(xn, xn_full.data());
  // Router: logits, softmax (double), top-k with ties to the lower expert index, renormalised weights.
  a.probs.assign(static_cast<std::size_t>(n * E), T(0));
  kc::linear_forward(a.probs.data(), x, w + ts[kRouter].offset, n, h, E);
  a.sel.assign(static_cast<std::size_t>(n * K), 0);
  a.wts.assign(static_cast<std::size_t>(n * K), T(0));
  std::vector<double> stat(static_cast<std::size_t>(2 * E), 0.0);  // counts, then Σ probabilities
  std::vector<char> taken(static_cast<std::size_t>(E));
  for (std::int64_t r = 0; r < n; ++r) {
    T* p = a.probs.data() + r * E;
    double mx = static_cast<double>(p[0]);
    for (int i = 1; i < E; ++i) mx = std::max(mx, static_cast<double>(p[i]));
    double sum = 0;
    std::vector<double> e(static_cast<std::size_t>(E));
    for (int i = 0; i < E; ++i) sum += (e[i] = std::exp(static_cast<double>(p[i]) - mx));
    for (int i = 0; i < E; ++i) p[i] = static_cast<T>(e[i] / sum);
    std::fill(taken.begin(), taken.end(), 0);
    T wsum = T(0);
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int i = 0; i < E; ++i)
        if (!taken[i] && (best < 0 || p[i] > p[best])) best = i;  // strict: ties keep the lower index
      taken[best] = 1;
      a.sel[r * K + k] = best;
      a.wts[r * K + k] = p[best];
      wsum += p[best];
      stat[best] += 1.0;
    }
    for (int k = 0; k < K; ++k) a.wts[r * K + k] /= wsum;
    for (int i = 0; i < E; ++i) stat[E + i] += static_cast<double>(p[i]);
  }
  // Load-balancing loss over the whole micro-batch: counts and probability sums over the CP shards (every
  // TP rank already holds all rows). aux = E·Σᵢ (cᵢ/(T·k))·(Σ pᵢ/T); ∂aux/∂p(r, i) = E·cᵢ/(T²·k).
  ep.cp->all_reduce(stat.data(), 2 * E);
  const double T_ = static_cast<double>(ep.tokens);
  double aux = 0;
  a.aux_grad.assign(static_cast<std::size_t>(E), T(0));
  for (int i = 0; i < E; ++i) {
    aux += (stat[i] / (T_ * K)) * (stat[E + i] / T_);
    a.aux_grad[i] = static_cast<T>(ep.aux_coef * E * stat[i] / (T_ * T_ * K));
  }
  if (ep.stats) {
    ep.stats->aux[static_cast<std::size_t>(layer)] += ep.aux_coef * E * aux;
    for (int i = 0; i < E; ++i) ep.stats->expert_tokens[static_cast<std::size_t>(layer) * E + i] += std::llround(stat[i]);
  }
  // Dispatch: assignments sorted by expert (stable: rows in order), counts per expert.
  std::vector<std::int64_t> order(static_cast<std::size_t>(n * K));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t x1, std::int64_t x2) { return a.sel[x1] < a.sel[x2]; });
  if (ep.fault_drop_token && !order.empty()) order.erase(order.begin());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(E), 0);
  for (std::int64_t i : order) ++counts[a.sel[i]];
  if (ep.fault_wrong_rank && P > 1 && counts[ep.local - 1] > 0) {
    --counts[ep.local - 1];  // the last row for EP rank 0 is counted as the first of EP rank 1's
    ++counts[ep.local];
  }
  a.slot_of.assign(static_cast<std::size_t>(n * K), -1);
  std::vector<T> send(order.size() * static_cast<std::size_t>(h));
  for (std::size_t q = 0; q < order.size(); ++q) {
    const std::int64_t r = order[q] / K;
    a.slot_of[order[q]] = static_cast<std::int64_t>(q);
    std::copy(x + r * h, x + (r + 1) * h, send.data() + q * h);
  }
  // Counts exchange: rank r gets this rank's counts for its own experts; then the rows.
  a.recv_counts.assign(static_cast<std::size_t>(P) * ep.local, 0);
  {
    std::vector<std::int64_t> c(static_cast<std::size_t>(P), ep.local);
    ep.ep->all_to_all(host_buf(counts.data(), P * ep.local), c.data(), host_buf(a.recv_counts.data(), P * ep.local), c.data());
  }
  a.send_rows.assign(static_cast<std::size_t>(P), 0);
  a.recv_rows.assign(static_cast<std::size_t>(P), 0);
  for (int r = 0; r < P; ++r)
    for (int j = 0; j < ep.local; ++j) {
      a.send_rows[r] += counts[static_cast<std::size_t>(r) * ep.local + j];
      a.recv_rows[r] += a.recv_counts[static_cast<std::size_t>(r) * ep.local + j];
    }
  const std::int64_t R = std::accumulate(a.recv_rows.begin(), a.recv_rows.end(), std::int64_t(0));
  a.xin.assign(static_cast<std::size_t>(R * h), T(0));
  std::int64_t bytes = exchange_rows(*ep.ep, send.data(), a.send_rows, a.xin.data(), a.recv_rows, h);
  // Every local expert on exactly its rows (a grouped GEMM over variable-size segments).
  a.gate.assign(static_cast<std::size_t>(R * f), T(0));
  a.up.assign(static_cast<std::size_t>(R * f), T(0));
  a.hact.assign(static_cast<std::size_t>(R * f), T(0));
  std::vector<T> eout(static_cast<std::size_t>(R * h), T(0));
  for_segments(ep, a.recv_counts, [&](int j, int, std::int64_t r0, std::int64_t rows) {
    const T* we = experts[j];
    kc::linear_forward(a.gate.data() + r0 * f, a.xin.data() + r0 * h, we + ets[kW1].offset, rows, h, f);
    kc::linear_forward(a.up.data() + r0 * f, a.xin.data() + r0 * h, we + ets[kW3].offset, rows, h, f);
    kc::swiglu_forward(a.hact.data() + r0 * f, a.gate.data() + r0 * f, a.up.data() + r0 * f, rows * f);
    kc::linear_forward(eout.data() + r0 * h, a.hact.data() + r0 * f, we + ets[kW2].offset, rows, f, h);
  });
  if (tp.size() > 1 && R > 0) tp.tp->all_reduce(eout.data(), R * h);  // w2 is column-split: partial sums
  // Results back in send order, combined with the routing weights in k order.
  a.ret.assign(order.size() * static_cast<std::size_t>(h), T(0));
  bytes += exchange_rows(*ep.ep, eout.data(), a.recv_rows, a.ret.data(), a.send_rows, h);
  if (ep.stats) ep.stats->a2a_bytes += bytes;
  for (std::int64_t r = 0; r < n; ++r) {
    T* y = y_full.data() + r * h;
    std::fill(y, y + h, T(0));
    for (int k = 0; k < K; ++k) {
      const std::int64_t q = a.slot_of[r * K + k];
      if (q < 0) continue;
      const T wk = a.wts[r * K + k];
      const T* e = a.ret.data() + q * h;
      for (std::int64_t c = 0; c < h; ++c) y[c] += wk * e[c];
    }
  }
  local_rows(tp, y_full.data(), out);
}

template <class T>
void moe_backward_input(const ExpertParallel& ep, const TensorParallel& tp, const std::vector<TensorSlot>& ts,
                        const T* w, const std::vector<const T*>& experts, const std::vector<TensorSlot>& ets,
                        MoeActs<T>& a, const T* dy, T* dxn, std::vector<T>& scratch) {
  const std::int64_t n = tp.n, h = tp.h, f = ep.ffn;
  const int E = ep.experts, K = ep.top_k;
  const std::int64_t sent = static_cast<std::int64_t>(a.ret.size()) / h;
  // Gradients at the returned expert outputs (weight · dy) and at the routing weights (<dy, output>).
  std::vector<T> dret(static_cast<std::size_t>(sent * h), T(0));
  std::vector<T> dwts(static_cast<std::size_t>(n * K), T(0));
  for (std::int64_t r = 0; r < n; ++r)
    for (int k = 0; k < K; ++k) {
      const std::int64_t q = a.slot_of[r * K + k];
      if (q < 0) continue;
      const T wk = a.wts[r * K + k];
      const T* g = dy + r * h;
      const T* e = a.ret.data() + q * h;
      T* d = dret.data() + q * h;
      double dot = 0;
      for (std::int64_t c = 0; c < h; ++c) {
        d[c] = wk * g[c];
        dot += static_cast<double>(g[c]) * static_cast<double>(e[c]);
      }
      dwts[r * K + k] = static_cast<T>(dot);
    }
  // To the experts (the forward's counts), through them, and back.
  const std::int64_t R = std::accumulate(a.recv_rows.begin(), a.recv_rows.end(), std::int64_t(0));
  a.dout.assign(static_cast<std::size_t>(R * h), T(0));
  std::int64_t bytes = exchange_rows(*ep.ep, dret.data(), a.send_rows, a.dout.data(), a.recv_rows, h);
  a.dgate.assign(static_cast<std::size_t>(R * f), T(0));
  a.dup.assign(static_cast<std::size_t>(R * f), T(0));
  std::vector<T> dx_in(static_cast<std::size_t>(R * h), T(0));
  scratch.resize(static_cast<std::size_t>(std::max<std::int64_t>(R * f, 1)));
  for_segments(ep, a.recv_counts, [&](int j, int, std::int64_t r0, std::int64_t rows) {
    const T* we = experts[j];
    kc::linear_backward_input(scratch.data(), a.dout.data() + r0 * h, we + ets[kW2].offset, rows, f, h);
    kc::swiglu_backward(a.dgate.data() + r0 * f, a.dup.data() + r0 * f, scratch.data(), a.gate.data() + r0 * f,
                        a.up.data() + r0 * f, rows * f);
    kc::linear_backward_input(dx_in.data() + r0 * h, a.dgate.data() + r0 * f, we + ets[kW1].offset, rows, h, f);
    kc::linear_backward_input(dx_in.data() + r0 * h, a.dup.data() + r0 * f, we + ets[kW3].offset, rows, h, f,
                              Store::accumulate);
  });
  if (tp.size() > 1 && R > 0) tp.tp->all_reduce(dx_in.data(), R * h);  // w1/w3 are row-split: partial sums
  std::vector<T> dxs(static_cast<std::size_t>(sent * h), T(0));
  bytes += exchange_rows(*ep.ep, dx_in.data(), a.recv_rows, dxs.data(), a.send_rows, h);
  if (ep.stats) ep.stats->a2a_bytes += bytes;
  // Router: renormalisation, the aux loss's constant ∂/∂p, softmax backward; a.probs becomes dlogits.
  std::vector<T> dx_full(static_cast<std::size_t>(n * h), T(0));
  std::vector<double> dp(static_cast<std::size_t>(E));
  for (std::int64_t r = 0; r < n; ++r) {
    T* xr = dx_full.data() + r * h;
    for (int k = 0; k < K; ++k) {
      const std::int64_t q = a.slot_of[r * K + k];
      if (q < 0) continue;
      const T* g = dxs.data() + q * h;
      for (std::int64_t c = 0; c < h; ++c) xr[c] += g[c];
    }
    T* p = a.probs.data() + r * E;
    double ssum = 0, wdw = 0;
    for (int k = 0; k < K; ++k) {
      ssum += static_cast<double>(p[a.sel[r * K + k]]);
      wdw += static_cast<double>(a.wts[r * K + k]) * static_cast<double>(dwts[r * K + k]);
    }
    for (int i = 0; i < E; ++i) dp[i] = static_cast<double>(a.aux_grad[i]);
    for (int k = 0; k < K; ++k) dp[a.sel[r * K + k]] += (static_cast<double>(dwts[r * K + k]) - wdw) / ssum;
    double pdp = 0;
    for (int i = 0; i < E; ++i) pdp += static_cast<double>(p[i]) * dp[i];
    for (int i = 0; i < E; ++i) p[i] = static_cast<T>(static_cast<double>(p[i]) * (dp[i] - pdp));
  }
  kc::linear_backward_input(dx_full.data(), a.probs.data(), w + ts[kRouter].offset, n, h, E, Store::accumulate);
  local_rows(tp, dx_full.data(), dxn);
}

template <class T>
void moe_router_backward_weight(const ExpertParallel& ep, const std::vector<TensorSlot>& ts, T* dw, MoeActs<T>& a,
                                const T* x, std::int64_t n, std::int64_t h) {
  kc::linear_backward_weight(dw + ts[kRouter].offset, a.probs.data(), x, n, h, ep.experts);
}

template <class T>
void moe_expert_backward_weight(const ExpertParallel& ep, int j, T* de, const std::vector<TensorSlot>& ets,
                                MoeActs<T>& a, std::int64_t h) {
  const std::int64_t f = ep.ffn;
  // Each (expert, source) segment's gradient is summed into a zeroed buffer and then added, so an expert's
  // gradient is ((0 + g_source0) + g_source1) + …: the single process's micro-batch accumulation order.
  std::vector<T> tmp(static_cast<std::size_t>(std::max<std::int64_t>(f * h, 1)));
  auto add_segment = [&](T* dst, auto&& compute) {
    std::fill(tmp.begin(), tmp.end(), T(0));
    compute(tmp.data());
    for (std::int64_t i = 0; i < f * h; ++i) dst[i] += tmp[i];
  };
  for_segments(ep, a.recv_counts, [&](int jj, int, std::int64_t r0, std::int64_t rows) {
    if (jj != j) return;
    add_segment(de + ets[kW2].offset, [&](T* g) {
      kc::linear_backward_weight(g, a.dout.data() + r0 * h, a.hact.data() + r0 * f, rows, f, h);
    });
    add_segment(de + ets[kW1].offset, [&](T* g) {
      kc::linear_backward_weight(g, a.dgate.data() + r0 * f, a.xin.data() + r0 * h, rows, h, f);
    });
    add_segment(de + ets[kW3].offset, [&](T* g) {
      kc::linear_backward_weight(g, a.dup.data() + r0 * f, a.xin.data() + r0 * h, rows, h, f);
    });
  });
}

#define MESHRUN_MOE_INSTANTIATE(T)                                                                                 \
  template struct MoeActs<T>;                                                                                      \
  template void moe_forward<T>(const ExpertParallel&, const TensorParallel&, int, const std::vector<TensorSlot>&,  \
                               const T*, const std::vector<const T*>&, const std::vector<TensorSlot>&, MoeActs<T>&, \
                               const T*, T*, std::vector<T>&, std::vector<T>&);                                    \
  template void moe_backward_input<T>(const ExpertParallel&, const TensorParallel&, const std::vector<TensorSlot>&, \
                                      const T*, const std::vector<const T*>&, const std::vector<TensorSlot>&,       \
                                      MoeActs<T>&, const T*, T*, std::vector<T>&);                       \
  template void moe_router_backward_weight<T>(const ExpertParallel&, const std::vector<TensorSlot>&, T*,           \
                                              MoeActs<T>&, const T*, std::int64_t, std::int64_t);                  \
  template void moe_expert_backward_weight<T>(const ExpertParallel&, int, T*, const std::vector<TensorSlot>&,      \
                                              MoeActs<T>&, std::int64_t);
MESHRUN_MOE_INSTANTIATE(float)
MESHRUN_MOE_INSTANTIATE(double)
#undef MESHRUN_MOE_INSTANTIATE

}  // namespace meshrun::train
