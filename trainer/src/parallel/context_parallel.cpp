#include "meshrun/train/parallel/context_parallel.hpp"

#include <chrono>
#include <utility>

namespace meshrun::train {

namespace {
constexpr int kTagKv = 21, kTagDkv = 22;

// Adds the scope's wall time to a counter.
struct Timed {
  double& total;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Timed() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

// Global chunk index of local half j (0 or 1) of CP rank r: chunks r and 2·cp−1−r.
int chunk_of(int r, int j, int cp) { return j == 0 ? r : 2 * cp - 1 - r; }

// Every visible (query half, key half) pair of the micro-batch against the K/V block of CP rank s, in a
// fixed order (sequence, query half, key half). f(q_row0, k_row0, qpos, kpos, diagonal).
template <class F>
void for_visible_pairs(const ContextParallel& cp, int s, F&& f) {
  const int P = cp.size(), r = cp.rank();
  const std::int64_t C = cp.seq / 2;
  for (std::int64_t b = 0; b < cp.mbs; ++b)
    for (int j = 0; j < 2; ++j)
      for (int kk = 0; kk < 2; ++kk) {
        const int qc = chunk_of(r, j, P), kc = chunk_of(s, kk, P);
        if (kc > qc) continue;  // the whole key chunk lies after the query chunk: fully masked
        f(b * cp.seq + j * C, b * cp.seq + kk * C, cp.pos_buf[r].at(j * C, C), cp.pos_buf[s].at(kk * C, C), kc == qc);
      }
}

// Rows [row0, row0 + rows) of a [·, heads, dh] tensor (heads·dh = width).
Buf rows_of(Buf t, std::int64_t row0, std::int64_t rows, std::int64_t width) { return t.at(row0 * width, rows * width); }

void attend_block(ContextParallel& cp, Buf out, Buf lse, std::vector<char>& have, Buf q, Buf kblk, Buf vblk, int s,
                  double scale) {
  const std::int64_t C = cp.seq / 2, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const device::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, s, [&](std::int64_t qr, std::int64_t kr, Buf qp, Buf kp, bool diag) {
    const Buf o = rows_of(out, qr, C, hq * dh), l = rows_of(lse, qr, C, hq);
    const Buf qq = rows_of(q, qr, C, hq * dh), kk = rows_of(kblk, kr, C, hkv * dh), vv = rows_of(vblk, kr, C, hkv * dh);
    const std::size_t slot = static_cast<std::size_t>(qr / C);
    if (!have[slot]) {
      cp.be->attention_forward(o, l, qq, kk, vv, qp, kp, ad, scale);
      have[slot] = 1;
    } else {
      const Buf po = cp.part_out.at(0, C * hq * dh), pl = cp.part_lse.at(0, C * hq);
      cp.be->attention_forward(po, pl, qq, kk, vv, qp, kp, ad, scale);
      cp.be->attention_merge(o, l, po, pl, C * hq, dh);
    }
    cp.pairs += diag ? C * (C + 1) / 2 : C * C;
  });
}

void attend_block_backward(ContextParallel& cp, Buf dq, Buf dkblk, Buf dvblk, Buf dout, Buf out, Buf lse, Buf q,
                           Buf kblk, Buf vblk, int s, double scale) {
  const std::int64_t C = cp.seq / 2, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const device::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, s, [&](std::int64_t qr, std::int64_t kr, Buf qp, Buf kp, bool) {
    const std::int64_t qw = hq * dh, kw = hkv * dh;
    cp.be->attention_backward(rows_of(dq, qr, C, qw), rows_of(dkblk, kr, C, kw), rows_of(dvblk, kr, C, kw),
                              rows_of(dout, qr, C, qw), rows_of(out, qr, C, qw), rows_of(lse, qr, C, hq),
                              rows_of(q, qr, C, qw), rows_of(kblk, kr, C, kw), rows_of(vblk, kr, C, kw), qp, kp, ad,
                              scale);
  });
}
}  // namespace

void ContextParallel::resize(device::Backend& backend) {
  be = &backend;
  const DType t = backend.precision().param;
  pos_buf.clear();
  for (const auto& p : pos) {
    pos_buf.emplace_back(backend, static_cast<std::int64_t>(p.size()), DType::i32);
    backend.upload(pos_buf.back(), p.data());
  }
  const std::int64_t kvn = mbs * seq * hkv * dh;
  const int P = size();
  if (P == 1) return;
  auto make = [&](device::DeviceBuffer& b, std::int64_t n, DType type) {
    b = device::DeviceBuffer(backend, n, type);
    backend.zero(b);
  };
  make(kv_send, 2 * kvn, t);
  make(kv_recv, 2 * kvn, t);
  make(dkv_send, 2 * kvn, t);
  make(dkv_recv, 2 * kvn, t);
  if (mode == CpComm::allgather) {
    make(kv_all, 2 * kvn * P, t);
    make(dkv_all, 2 * kvn * P, t);
  }
  make(part_out, seq / 2 * hq * dh, t);
  make(part_lse, seq / 2 * hq, backend.precision().stat);  // a row statistic, like lse
}

std::int64_t ContextParallel::bytes() const {
  std::int64_t n = 0;
  for (const device::DeviceBuffer* b : {&kv_send, &kv_recv, &kv_all, &dkv_send, &dkv_recv, &dkv_all, &part_out, &part_lse})
    n += b->bytes();
  return n;
}

void cp_attention_forward(ContextParallel& cp, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, double scale) {
  const Timed timed{cp.seconds};
  device::Backend& be = *cp.be;
  const std::int64_t S = cp.seq, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    const device::AttentionDims ad{S, S, hq, hkv, dh};
    for (std::int64_t b = 0; b < cp.mbs; ++b) {
      const Buf pb = qpos.at(b * S, S);
      be.attention_forward(rows_of(out, b * S, S, hq * dh), rows_of(lse, b * S, S, hq), rows_of(q, b * S, S, hq * dh),
                           rows_of(k, b * S, S, hkv * dh), rows_of(v, b * S, S, hkv * dh), pb, pb, ad, scale);
    }
    cp.pairs += cp.mbs * S * (S + 1) / 2;
    return;
  }
  const std::int64_t kvn = cp.mbs * S * hkv * dh;
  std::vector<char> have(static_cast<std::size_t>(cp.mbs * 2), 0);
  be.copy(cp.kv_send.at(0, kvn), k.at(0, kvn));
  be.copy(cp.kv_send.at(kvn, kvn), v.at(0, kvn));
  if (cp.mode == CpComm::allgather) {
    cp.cp->all_gather(cp.kv_send.at(0, 2 * kvn), cp.kv_all.at(0, 2 * kvn * P));
    for (int i = 0; i < P; ++i) {
      const int s = (r - i + P) % P;
      const Buf blk = cp.kv_all.at(static_cast<std::int64_t>(s) * 2 * kvn, 2 * kvn);
      attend_block(cp, out, lse, have, q, blk.at(0, kvn), blk.at(kvn, kvn), s, scale);
    }
    return;
  }
  for (int i = 0; i < P; ++i) {
    const int s = (r - i + P) % P;
    Request rx, tx;
    if (i < P - 1) {  // the next block travels while this one is computed
      rx = cp.cp->irecv(cp.kv_recv.at(0, 2 * kvn), cp.prev, kTagKv);
      tx = cp.cp->isend(cp.kv_send.at(0, 2 * kvn), cp.next, kTagKv);
    }
    attend_block(cp, out, lse, have, q, cp.kv_send.at(0, kvn), cp.kv_send.at(kvn, kvn), s, scale);
    rx.wait();
    tx.wait();
    std::swap(cp.kv_send, cp.kv_recv);
  }
}

void cp_attention_backward(ContextParallel& cp, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k,
                           Buf v, Buf qpos, double scale) {
  const Timed timed{cp.seconds};
  device::Backend& be = *cp.be;
  const std::int64_t S = cp.seq, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    const device::AttentionDims ad{S, S, hq, hkv, dh};
    for (std::int64_t b = 0; b < cp.mbs; ++b) {
      const std::int64_t qw = hq * dh, kw = hkv * dh;
      const Buf pb = qpos.at(b * S, S);
      be.attention_backward(rows_of(dq, b * S, S, qw), rows_of(dk, b * S, S, kw), rows_of(dv, b * S, S, kw),
                            rows_of(dout, b * S, S, qw), rows_of(out, b * S, S, qw), rows_of(lse, b * S, S, hq),
                            rows_of(q, b * S, S, qw), rows_of(k, b * S, S, kw), rows_of(v, b * S, S, kw), pb, pb, ad,
                            scale);
    }
    return;
  }
  const std::int64_t kvn = cp.mbs * S * hkv * dh;
  be.copy(cp.kv_send.at(0, kvn), k.at(0, kvn));
  be.copy(cp.kv_send.at(kvn, kvn), v.at(0, kvn));
  if (cp.mode == CpComm::allgather) {
    // K/V were not kept from the forward: gather them again; each rank's dK/dV contributions to every
    // block are reduce-scattered to the block's owner (fixed rank order).
    cp.cp->all_gather(cp.kv_send.at(0, 2 * kvn), cp.kv_all.at(0, 2 * kvn * P));
    be.zero(cp.dkv_all);
    for (int i = 0; i < P; ++i) {
      const int s = (r - i + P) % P;
      const Buf blk = cp.kv_all.at(static_cast<std::int64_t>(s) * 2 * kvn, 2 * kvn);
      const Buf dblk = cp.dkv_all.at(static_cast<std::int64_t>(s) * 2 * kvn, 2 * kvn);
      attend_block_backward(cp, dq, dblk.at(0, kvn), dblk.at(kvn, kvn), dout, out, lse, q, blk.at(0, kvn),
                            blk.at(kvn, kvn), s, scale);
    }
    cp.cp->reduce_scatter(cp.dkv_all.at(0, 2 * kvn * P), cp.dkv_recv.at(0, 2 * kvn), ReduceOp::sum);
    be.add(dk.at(0, kvn), cp.dkv_recv.at(0, kvn));
    be.add(dv.at(0, kvn), cp.dkv_recv.at(kvn, kvn));
    return;
  }
  // Ring: block s travels with its dK/dV accumulator; after P hops the accumulator is home.
  be.zero(cp.dkv_send);
  for (int i = 0; i < P; ++i) {
    const int s = (r - i + P) % P;
    Request rx, tx;
    if (i < P - 1) {
      rx = cp.cp->irecv(cp.kv_recv.at(0, 2 * kvn), cp.prev, kTagKv);
      tx = cp.cp->isend(cp.kv_send.at(0, 2 * kvn), cp.next, kTagKv);
    }
    attend_block_backward(cp, dq, cp.dkv_send.at(0, kvn), cp.dkv_send.at(kvn, kvn), dout, out, lse, q,
                          cp.kv_send.at(0, kvn), cp.kv_send.at(kvn, kvn), s, scale);
    cp.cp->sendrecv(cp.dkv_send.at(0, 2 * kvn), cp.next, cp.dkv_recv.at(0, 2 * kvn), cp.prev, kTagDkv);
    std::swap(cp.dkv_send, cp.dkv_recv);
    rx.wait();
    tx.wait();
    std::swap(cp.kv_send, cp.kv_recv);
  }
  be.add(dk.at(0, kvn), cp.dkv_send.at(0, kvn));
  be.add(dv.at(0, kvn), cp.dkv_send.at(kvn, kvn));
}

std::vector<std::int64_t> causal_pairs_per_rank(std::int64_t S, int cp, bool zigzag) {
  std::vector<std::int64_t> out(static_cast<std::size_t>(cp), 0);
  for (int r = 0; r < cp; ++r) {
    auto add_range = [&](std::int64_t lo, std::int64_t n) {  // query positions [lo, lo+n) see lo+1 … lo+n keys
      for (std::int64_t p = lo; p < lo + n; ++p) out[r] += p + 1;
    };
    if (zigzag) {
      const std::int64_t C = S / (2 * cp);
      add_range(r * C, C);
      add_range((2 * cp - 1 - r) * C, C);
    } else {
      add_range(r * (S / cp), S / cp);
    }
  }
  return out;
}

}  // namespace meshrun::train
