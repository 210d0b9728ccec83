#include "meshrun/train/parallel/moe.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace meshrun::train {

std::int64_t MoeActs::bytes() const {
  std::int64_t b = 0;
  for (const device::DeviceBuffer* d : {&probs, &sel, &wts, &slot, &aux_grad, &xin, &gate, &up, &hact, &ret, &dout, &dgate, &dup})
    b += d->bytes();
  for (const std::vector<std::int64_t>* v : {&send_rows, &recv_rows, &recv_counts})
    b += static_cast<std::int64_t>(v->capacity() * sizeof(std::int64_t));
  return b;
}

namespace {

Buf tensor(Buf unit, const TensorSlot& t) { return unit.at(t.offset, t.numel()); }

// All-to-all of rows [·, h] with per-rank row counts; returns the bytes sent to other ranks.
std::int64_t exchange_rows(Comm& c, Buf send, const std::vector<std::int64_t>& send_rows, Buf recv,
                           const std::vector<std::int64_t>& recv_rows, std::int64_t h) {
  std::vector<std::int64_t> sc(send_rows.size()), rc(recv_rows.size());
  std::int64_t bytes = 0, sn = 0, rn = 0;
  for (std::size_t r = 0; r < sc.size(); ++r) {
    sc[r] = send_rows[r] * h;
    rc[r] = recv_rows[r] * h;
    if (static_cast<int>(r) != c.rank()) bytes += sc[r] * static_cast<std::int64_t>(dtype_size(send.t));
    sn += sc[r];
    rn += rc[r];
  }
  c.all_to_all(send.at(0, sn), sc.data(), recv.at(0, rn), rc.data());
  return bytes;
}

// The rows this rank keeps of a full [n, h] buffer (sequence parallel: its contiguous slice).
void local_rows(const ExpertParallel& ep, const TensorParallel& tp, Buf full, Buf out) {
  const std::int64_t r0 = tp.gathers() ? tp.tp->rank() * tp.nl : 0;
  ep.be->copy(out.at(0, tp.nl * tp.h), full.at(r0 * tp.h, tp.nl * tp.h));
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

void moe_forward(const ExpertParallel& ep, const TensorParallel& tp, int layer, const std::vector<TensorSlot>& ts,
                 Buf w, const std::vector<Buf>& experts, const std::vector<TensorSlot>& ets, MoeActs& a, Buf xn,
                 Buf out, Buf xn_full, Buf y_full) {
  device::Backend& be = *ep.be;
  const DType t = be.precision().param, st = be.precision().stat;  // rows; router probabilities and weights
  const std::int64_t n = tp.n, h = tp.h, f = ep.ffn;
  const int E = ep.experts, K = ep.top_k, P = ep.ep->size();
  const Buf x = tp.full_rows(xn, xn_full);
  a.n = n;
  // Router: logits, softmax (double), top-k with ties to the lower expert index, renormalised weights.
  const Buf probs = a.probs.ensure(be, n * E, st), sel = a.sel.ensure(be, n * K, DType::i32);
  const Buf wts = a.wts.ensure(be, n * K, st);
  be.linear_forward(probs, x, tensor(w, ts[kRouter]), n, h, E);
  if (ep.observe_logits) {
    std::vector<double> logits(static_cast<std::size_t>(n * E));
    be.download(logits.data(), probs);
    ep.observe_logits(layer, a.microbatch, logits);
  }
  device::DeviceBuffer stat_buf(be, 2 * E, DType::f64);  // counts, then Σ probabilities
  be.zero(stat_buf);
  be.moe_route(probs, sel, wts, stat_buf, n, E, K);
  std::vector<double> stat(static_cast<std::size_t>(2 * E));
  be.download(stat.data(), stat_buf);
  // Load-balancing loss over the whole micro-batch: counts and probability sums over the CP shards (every
  // TP rank already holds all rows).
  ep.cp->all_reduce(stat.data(), 2 * E);
  if (ep.pooled) {
    // "hf": this layer's statistics join the micro-batch's pool; the gradient waits for the backward.
    if (!ep.stats) throw std::logic_error("router_aux = \"hf\" needs the MoE statistics");
    double* pool = ep.stats->pooled.data() + static_cast<std::size_t>(a.microbatch) * 2 * E;
    for (int i = 0; i < 2 * E; ++i) pool[i] += stat[i];
  } else {
    // "meshrun", per layer: aux = E·Σᵢ (cᵢ/(T·k))·(Σ pᵢ/T); ∂aux/∂p(r, i) = E·cᵢ/(T²·k).
    const double T_ = static_cast<double>(ep.tokens);
    double aux = 0;
    std::vector<double> aux_grad(static_cast<std::size_t>(E));
    for (int i = 0; i < E; ++i) {
      aux += (stat[i] / (T_ * K)) * (stat[E + i] / T_);
      aux_grad[i] = ep.aux_coef * E * stat[i] / (T_ * T_ * K);
    }
    be.upload(a.aux_grad.ensure(be, E, st), aux_grad.data());  // rounded to the statistics' type
    if (ep.stats) ep.stats->aux[static_cast<std::size_t>(layer)] += ep.aux_coef * E * aux;
  }
  if (ep.stats)
    for (int i = 0; i < E; ++i) ep.stats->expert_tokens[static_cast<std::size_t>(layer) * E + i] += std::llround(stat[i]);
  // Dispatch, decided on the host from the selected experts: assignments sorted by expert (stable: rows in
  // order), counts per expert, each assignment's row in the send order.
  std::vector<double> sel_host(static_cast<std::size_t>(n * K));
  be.download(sel_host.data(), sel);
  std::vector<std::int64_t> order(static_cast<std::size_t>(n * K));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t x1, std::int64_t x2) { return sel_host[x1] < sel_host[x2]; });
  if (ep.fault_drop_token && !order.empty()) order.erase(order.begin());
  std::vector<std::int64_t> counts(static_cast<std::size_t>(E), 0);
  for (std::int64_t i : order) ++counts[static_cast<std::size_t>(sel_host[i])];
  if (ep.fault_wrong_rank && P > 1 && counts[ep.local - 1] > 0) {
    --counts[ep.local - 1];  // the last row for EP rank 0 is counted as the first of EP rank 1's
    ++counts[ep.local];
  }
  const std::int64_t Q = static_cast<std::int64_t>(order.size());
  std::vector<std::int32_t> slot_of(static_cast<std::size_t>(n * K), -1), source_row(static_cast<std::size_t>(Q));
  for (std::int64_t q = 0; q < Q; ++q) {
    slot_of[order[q]] = static_cast<std::int32_t>(q);
    source_row[q] = static_cast<std::int32_t>(order[q] / K);
  }
  be.upload(a.slot.ensure(be, n * K, DType::i32), slot_of.data());
  device::DeviceBuffer index(be, Q, DType::i32), send(be, Q * h, t);
  be.upload(index.at(0, Q), source_row.data());
  be.gather_rows(send.at(0, Q * h), x, index.at(0, Q), Q, h);
  a.rows_sent = Q;
  // Counts exchange (host counts): rank r gets this rank's counts for its own experts; then the rows.
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
  a.rows_in = R;
  const Buf xin = a.xin.ensure(be, R * h, t);
  std::int64_t bytes = exchange_rows(*ep.ep, send, a.send_rows, xin, a.recv_rows, h);
  // Every local expert on exactly its rows (a grouped GEMM over variable-size segments).
  const Buf gate = a.gate.ensure(be, R * f, t), up = a.up.ensure(be, R * f, t);
  device::DeviceBuffer hact_transient;  // selective recomputation: the SwiGLU output only while it is used
  const Buf hact = ep.keep_hact ? a.hact.ensure(be, R * f, t) : hact_transient.ensure(be, R * f, t);
  device::DeviceBuffer eout(be, R * h, t);
  be.zero(eout);
  for_segments(ep, a.recv_counts, [&](int j, int, std::int64_t r0, std::int64_t rows) {
    const Buf we = experts[j];
    const Buf g = gate.at(r0 * f, rows * f), u = up.at(r0 * f, rows * f), ha = hact.at(r0 * f, rows * f);
    be.linear_forward(g, xin.at(r0 * h, rows * h), tensor(we, ets[kW1]), rows, h, f);
    be.linear_forward(u, xin.at(r0 * h, rows * h), tensor(we, ets[kW3]), rows, h, f);
    be.swiglu_forward(ha, g, u, rows * f);
    be.linear_forward(eout.at(r0 * h, rows * h), ha, tensor(we, ets[kW2]), rows, f, h);
  });
  if (tp.size() > 1 && R > 0) tp.tp->all_reduce(eout.at(0, R * h), ReduceOp::sum);  // w2 is column-split: partial sums
  // Results back in send order, combined with the routing weights in k order.
  const Buf ret = a.ret.ensure(be, Q * h, t);
  bytes += exchange_rows(*ep.ep, eout, a.recv_rows, ret, a.send_rows, h);
  if (ep.stats) ep.stats->a2a_bytes += bytes;
  be.moe_combine(y_full.at(0, n * h), ret, wts, a.slot.at(0, n * K), n, K, h);
  local_rows(ep, tp, y_full, out);
}

void moe_backward_input(const ExpertParallel& ep, const TensorParallel& tp, const std::vector<TensorSlot>& ts, Buf w,
                        const std::vector<Buf>& experts, const std::vector<TensorSlot>& ets, MoeActs& a, Buf dy,
                        Buf dxn, device::DeviceBuffer& scratch) {
  device::Backend& be = *ep.be;
  const DType t = be.precision().param;
  const std::int64_t n = tp.n, h = tp.h, f = ep.ffn, R = a.rows_in, Q = a.rows_sent;
  const int E = ep.experts, K = ep.top_k;
  const Buf probs = a.probs.at(0, n * E), sel = a.sel.at(0, n * K), wts = a.wts.at(0, n * K), slot = a.slot.at(0, n * K);
  const Buf ret = a.ret.at(0, Q * h);
  // Gradients at the returned expert outputs (weight · dy) and at the routing weights (<dy, output>).
  device::DeviceBuffer dret(be, Q * h, t), dwts(be, n * K, be.precision().stat);
  be.zero(dret);
  be.zero(dwts);
  be.moe_combine_backward(dret.at(0, Q * h), dwts, dy.at(0, n * h), ret, wts, slot, n, K, h);
  // To the experts (the forward's counts), through them, and back.
  const Buf dout = a.dout.ensure(be, R * h, t);
  std::int64_t bytes = exchange_rows(*ep.ep, dret, a.send_rows, dout, a.recv_rows, h);
  const Buf dgate = a.dgate.ensure(be, R * f, t), dup = a.dup.ensure(be, R * f, t);
  const Buf gate = a.gate.at(0, R * f), up = a.up.at(0, R * f);
  device::DeviceBuffer dx_in(be, R * h, t);
  be.zero(dx_in);
  const Buf sc = scratch.ensure(be, std::max<std::int64_t>(R * f, 1), t);
  for_segments(ep, a.recv_counts, [&](int j, int, std::int64_t r0, std::int64_t rows) {
    const Buf we = experts[j];
    const Buf s = sc.at(0, rows * f), dg = dgate.at(r0 * f, rows * f), du = dup.at(r0 * f, rows * f);
    const Buf dx = dx_in.at(r0 * h, rows * h);
    be.linear_backward_input(s, dout.at(r0 * h, rows * h), tensor(we, ets[kW2]), rows, f, h, false);
    be.swiglu_backward(dg, du, s, gate.at(r0 * f, rows * f), up.at(r0 * f, rows * f), rows * f);
    be.linear_backward_input(dx, dg, tensor(we, ets[kW1]), rows, h, f, false);
    be.linear_backward_input(dx, du, tensor(we, ets[kW3]), rows, h, f, true);
  });
  if (tp.size() > 1 && R > 0) tp.tp->all_reduce(dx_in.at(0, R * h), ReduceOp::sum);  // w1/w3 are row-split: partial sums
  device::DeviceBuffer dxs(be, Q * h, t), dx_full(be, n * h, t);
  bytes += exchange_rows(*ep.ep, dx_in, a.recv_rows, dxs, a.send_rows, h);
  if (ep.stats) ep.stats->a2a_bytes += bytes;
  // Each row's input gradient: its assignments' in k order (weight 1: the weights sit after the experts).
  be.moe_combine(dx_full.at(0, n * h), dxs.at(0, Q * h), Buf{}, slot, n, K, h);
  if (ep.pooled) {
    // "hf": aux = E·Σᵢ (Cᵢ/(L·T))·(Pᵢ/(L·T)) over the pooled statistics, complete now (pp = 1: every layer's
    // forward of this micro-batch ran before any of its backwards); ∂aux/∂p_l(r, i) = E·Cᵢ/(L·T)².
    const double LT = static_cast<double>(ep.layers) * static_cast<double>(ep.tokens);
    const double* pool = ep.stats->pooled.data() + static_cast<std::size_t>(a.microbatch) * 2 * E;
    std::vector<double> aux_grad(static_cast<std::size_t>(E));
    for (int i = 0; i < E; ++i) aux_grad[i] = ep.aux_coef * E * pool[i] / (LT * LT);
    be.upload(a.aux_grad.ensure(be, E, be.precision().stat), aux_grad.data());
  }
  // Router: renormalisation, the aux loss's constant ∂/∂p, softmax backward; probs becomes dlogits.
  be.moe_router_backward(probs, sel, wts, dwts, a.aux_grad.at(0, E), n, E, K);
  be.linear_backward_input(dx_full.at(0, n * h), probs, tensor(w, ts[kRouter]), n, h, E, true);
  local_rows(ep, tp, dx_full, dxn);
}

double pooled_aux_loss(const ExpertParallel& ep) {
  const int E = ep.experts;
  const double LT = static_cast<double>(ep.layers) * static_cast<double>(ep.tokens);
  const std::vector<double>& pool = ep.stats->pooled;
  double total = 0;
  for (std::size_t m = 0; m < pool.size() / (2 * static_cast<std::size_t>(E)); ++m) {
    const double* p = pool.data() + m * 2 * E;
    double aux = 0;
    for (int i = 0; i < E; ++i) aux += (p[i] / LT) * (p[E + i] / LT);
    total += ep.aux_coef * E * aux;
  }
  return total;
}

void moe_router_backward_weight(const ExpertParallel& ep, const std::vector<TensorSlot>& ts, Buf dw, MoeActs& a,
                                Buf x, std::int64_t n, std::int64_t h) {
  ep.be->linear_backward_weight(tensor(dw, ts[kRouter]), a.probs.at(0, n * ep.experts), x.at(0, n * h), n, h,
                                ep.experts);
}

void moe_expert_backward_weight(const ExpertParallel& ep, int j, Buf de, const std::vector<TensorSlot>& ets,
                                MoeActs& a, std::int64_t h) {
  device::Backend& be = *ep.be;
  const std::int64_t f = ep.ffn;
  // Each (expert, source) segment's gradient is summed into a zeroed buffer and then added, so an expert's
  // gradient is ((0 + g_source0) + g_source1) + …: the single process's micro-batch accumulation order.
  device::DeviceBuffer tmp_buf(be, std::max<std::int64_t>(f * h, 1), be.precision().grad);
  const Buf tmp = tmp_buf.at(0, f * h);
  auto add_segment = [&](Buf dst, auto&& compute) {
    be.zero(tmp);
    compute(tmp);
    be.add(dst, tmp);
  };
  device::DeviceBuffer hact_buf;  // keep_hact false: each segment's SwiGLU output, recomputed
  for_segments(ep, a.recv_counts, [&](int jj, int, std::int64_t r0, std::int64_t rows) {
    if (jj != j) return;
    Buf hact = ep.keep_hact ? a.hact.at(r0 * f, rows * f) : Buf{};
    if (!ep.keep_hact) {
      hact = hact_buf.ensure(be, std::max<std::int64_t>(rows * f, 1), be.precision().param).at(0, rows * f);
      be.swiglu_forward(hact, a.gate.at(r0 * f, rows * f), a.up.at(r0 * f, rows * f), rows * f);
    }
    add_segment(tensor(de, ets[kW2]), [&](Buf g) {
      be.linear_backward_weight(g, a.dout.at(r0 * h, rows * h), hact, rows, f, h);
    });
    add_segment(tensor(de, ets[kW1]), [&](Buf g) {
      be.linear_backward_weight(g, a.dgate.at(r0 * f, rows * f), a.xin.at(r0 * h, rows * h), rows, h, f);
    });
    add_segment(tensor(de, ets[kW3]), [&](Buf g) {
      be.linear_backward_weight(g, a.dup.at(r0 * f, rows * f), a.xin.at(r0 * h, rows * h), rows, h, f);
    });
  });
}

}  // namespace meshrun::train
