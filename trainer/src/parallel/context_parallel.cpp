#include "meshrun/train/parallel/context_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
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

// One level of the attention: `members` ring members, this rank being member `me`; a member holds `rows`
// rows per sequence (its chunks, C each) for hq / hkv heads. Ring and all-gather: the cp ranks, 2 chunks,
// all the rank's heads; alltoall: one member, every chunk, hq/cp heads; alltoall+ring: the groups.
struct Level {
  int members, me;
  std::int64_t rows, hq, hkv;
};
Level level_of(const ContextParallel& cp) {
  const int A = cp.a2a;
  return {cp.size() / A, cp.rank() / A, A * cp.seq, cp.hq / A, cp.hkv / A};
}

// Every visible (query chunk, key chunk) pair of the micro-batch against the K/V block of member s, in a
// fixed order (sequence, query chunk, key chunk). f(q_row0, k_row0, qpos, kpos, diagonal).
template <class F>
void for_visible_pairs(const ContextParallel& cp, const Level& lv, int s, F&& f) {
  const std::int64_t C = cp.seq / 2;
  const std::vector<int>& mine = cp.member_chunks[static_cast<std::size_t>(lv.me)];
  const std::vector<int>& theirs = cp.member_chunks[static_cast<std::size_t>(s)];
  for (std::int64_t b = 0; b < cp.mbs; ++b)
    for (std::size_t j = 0; j < mine.size(); ++j)
      for (std::size_t kk = 0; kk < theirs.size(); ++kk) {
        const int qc = mine[j], kc = theirs[kk];
        if (kc > qc) continue;  // the whole key chunk lies after the query chunk: fully masked
        const std::int64_t qo = static_cast<std::int64_t>(j) * C, ko = static_cast<std::int64_t>(kk) * C;
        f(b * lv.rows + qo, b * lv.rows + ko, cp.pos_buf[static_cast<std::size_t>(lv.me)].at(qo, C),
          cp.pos_buf[static_cast<std::size_t>(s)].at(ko, C), kc == qc);
      }
}

// Rows [row0, row0 + rows) of a [·, heads, dh] tensor (heads·dh = width).
Buf rows_of(Buf t, std::int64_t row0, std::int64_t rows, std::int64_t width) { return t.at(row0 * width, rows * width); }

void attend_block(ContextParallel& cp, const Level& lv, Buf out, Buf lse, std::vector<char>& have, Buf q, Buf kblk,
                  Buf vblk, int s, double scale) {
  const std::int64_t C = cp.seq / 2, hq = lv.hq, hkv = lv.hkv, dh = cp.dh;
  const device::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, lv, s, [&](std::int64_t qr, std::int64_t kr, Buf qp, Buf kp, bool diag) {
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
    cp.pair_heads += (diag ? C * (C + 1) / 2 : C * C) * hq;
  });
}

void attend_block_backward(ContextParallel& cp, const Level& lv, Buf dq, Buf dkblk, Buf dvblk, Buf dout, Buf out,
                           Buf lse, Buf q, Buf kblk, Buf vblk, int s, double scale) {
  const std::int64_t C = cp.seq / 2, hq = lv.hq, hkv = lv.hkv, dh = cp.dh;
  const device::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, lv, s, [&](std::int64_t qr, std::int64_t kr, Buf qp, Buf kp, bool) {
    const std::int64_t qw = hq * dh, kw = hkv * dh;
    cp.be->attention_backward(rows_of(dq, qr, C, qw), rows_of(dkblk, kr, C, kw), rows_of(dvblk, kr, C, kw),
                              rows_of(dout, qr, C, qw), rows_of(out, qr, C, qw), rows_of(lse, qr, C, hq),
                              rows_of(q, qr, C, qw), rows_of(kblk, kr, C, kw), rows_of(vblk, kr, C, kw), qp, kp, ad,
                              scale);
  });
}

// Whole sequences of `rows` rows in one causal call each (cp = 1, and alltoall's single member, whose
// rows are in sequence order: the single process's call, for lv.hq of its heads).
void whole_forward(ContextParallel& cp, const Level& lv, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf pos, double scale,
                   bool pos_per_sequence) {
  const std::int64_t S = lv.rows, hq = lv.hq, hkv = lv.hkv, dh = cp.dh;
  const device::AttentionDims ad{S, S, hq, hkv, dh};
  for (std::int64_t b = 0; b < cp.mbs; ++b) {
    const Buf pb = pos.at(pos_per_sequence ? b * S : 0, S);
    cp.be->attention_forward(rows_of(out, b * S, S, hq * dh), rows_of(lse, b * S, S, hq), rows_of(q, b * S, S, hq * dh),
                             rows_of(k, b * S, S, hkv * dh), rows_of(v, b * S, S, hkv * dh), pb, pb, ad, scale);
  }
  cp.pair_heads += cp.mbs * S * (S + 1) / 2 * hq;
}
void whole_backward(ContextParallel& cp, const Level& lv, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q,
                    Buf k, Buf v, Buf pos, double scale, bool pos_per_sequence) {
  const std::int64_t S = lv.rows, hq = lv.hq, hkv = lv.hkv, dh = cp.dh, qw = hq * dh, kw = hkv * dh;
  const device::AttentionDims ad{S, S, hq, hkv, dh};
  for (std::int64_t b = 0; b < cp.mbs; ++b) {
    const Buf pb = pos.at(pos_per_sequence ? b * S : 0, S);
    cp.be->attention_backward(rows_of(dq, b * S, S, qw), rows_of(dk, b * S, S, kw), rows_of(dv, b * S, S, kw),
                              rows_of(dout, b * S, S, qw), rows_of(out, b * S, S, qw), rows_of(lse, b * S, S, hq),
                              rows_of(q, b * S, S, qw), rows_of(k, b * S, S, kw), rows_of(v, b * S, S, kw), pb, pb, ad,
                              scale);
  }
}

// The level's forward: out, lse (overwritten) of this member's rows from its q and every member's K/V.
void level_forward(ContextParallel& cp, const Level& lv, Buf out, Buf lse, Buf q, Buf k, Buf v, double scale) {
  if (lv.members == 1) return whole_forward(cp, lv, out, lse, q, k, v, cp.pos_buf[0], scale, false);
  device::Backend& be = *cp.be;
  const int P = lv.members, r = lv.me;
  const std::int64_t kvn = cp.mbs * lv.rows * lv.hkv * cp.dh;
  std::vector<char> have(cp.member_chunks[static_cast<std::size_t>(r)].size() * static_cast<std::size_t>(cp.mbs), 0);
  be.copy(cp.kv_send.at(0, kvn), k.at(0, kvn));
  be.copy(cp.kv_send.at(kvn, kvn), v.at(0, kvn));
  if (cp.mode == CpComm::allgather) {
    cp.cp->all_gather(cp.kv_send.at(0, 2 * kvn), cp.kv_all.at(0, 2 * kvn * P));
    for (int i = 0; i < P; ++i) {
      const int s = (r - i + P) % P;
      const Buf blk = cp.kv_all.at(static_cast<std::int64_t>(s) * 2 * kvn, 2 * kvn);
      attend_block(cp, lv, out, lse, have, q, blk.at(0, kvn), blk.at(kvn, kvn), s, scale);
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
    attend_block(cp, lv, out, lse, have, q, cp.kv_send.at(0, kvn), cp.kv_send.at(kvn, kvn), s, scale);
    rx.wait();
    tx.wait();
    std::swap(cp.kv_send, cp.kv_recv);
  }
}

// The level's backward: dq (this member's rows), dk, dv (its K/V block, from every member's queries)
// accumulated.
void level_backward(ContextParallel& cp, const Level& lv, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q,
                    Buf k, Buf v, double scale) {
  if (lv.members == 1) return whole_backward(cp, lv, dq, dk, dv, dout, out, lse, q, k, v, cp.pos_buf[0], scale, false);
  device::Backend& be = *cp.be;
  const int P = lv.members, r = lv.me;
  const std::int64_t kvn = cp.mbs * lv.rows * lv.hkv * cp.dh;
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
      attend_block_backward(cp, lv, dq, dblk.at(0, kvn), dblk.at(kvn, kvn), dout, out, lse, q, blk.at(0, kvn),
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
    attend_block_backward(cp, lv, dq, cp.dkv_send.at(0, kvn), cp.dkv_send.at(kvn, kvn), dout, out, lse, q,
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

// The all-to-all inside this rank's group of a2a consecutive CP ranks, for a [n, a2a·w] tensor: to_members
// sends piece t (width w: the t-th share of the heads) of every local row to the group's rank t and puts
// what arrives in member order (dst: [n·a2a rows, w], the group's rows of each sequence in chunk order);
// from_members is its inverse.
void exchange(ContextParallel& cp, Buf dst, Buf src, std::int64_t w, bool stat, Buf first, Buf second) {
  const std::int64_t n = cp.mbs * cp.seq, A = cp.a2a;
  const Buf send = (stat ? cp.a2a_send_stat : cp.a2a_send).at(0, n * A * w);
  const Buf recv = (stat ? cp.a2a_recv_stat : cp.a2a_recv).at(0, n * A * w);
  cp.be->gather_rows(send, src, first, n * A, w);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(cp.size()), 0);
  const int g = cp.rank() / cp.a2a;
  for (int t = 0; t < cp.a2a; ++t) counts[static_cast<std::size_t>(g * cp.a2a + t)] = n * w;
  cp.cp->all_to_all(send, counts.data(), recv, counts.data());
  cp.be->gather_rows(dst, recv, second, n * A, w);
}
void to_members(ContextParallel& cp, Buf dst, Buf src, std::int64_t w, bool stat = false) {
  exchange(cp, dst, src, w, stat, cp.pack, cp.unpack);
}
void from_members(ContextParallel& cp, Buf dst, Buf src, std::int64_t w, bool stat = false) {
  exchange(cp, dst, src, w, stat, cp.unpack_inv, cp.pack_inv);
}
}  // namespace

std::optional<CpComm> parse_cp_comm(const std::string& s) {
  if (s == "ring") return CpComm::ring;
  if (s == "allgather") return CpComm::allgather;
  if (s == "alltoall") return CpComm::alltoall;
  if (s == "alltoall+ring") return CpComm::alltoall_ring;
  return std::nullopt;
}

void ContextParallel::resize(device::Backend& backend) {
  be = &backend;
  const DType t = backend.precision().param, stat = backend.precision().stat;
  const int P = size(), r = rank();
  if (P == 1) a2a = 1;  // every cp_comm is the plain attention at cp 1
  if ((P > 1 && (mode == CpComm::ring || mode == CpComm::allgather) != (a2a == 1)) ||
      (P > 1 && mode == CpComm::alltoall && a2a != P) || a2a < 1 || P % a2a != 0 || hq % a2a != 0 || hkv % a2a != 0)
    throw std::logic_error("context parallelism: an all-to-all group of " + std::to_string(a2a) + " over cp " +
                           std::to_string(P) + " with " + std::to_string(hq) + " / " + std::to_string(hkv) +
                           " heads reached the trainer (validate_trainer's cp-alltoall refuses it)");
  const int G = P / a2a;
  const std::int64_t C = seq / 2;
  // A global chunk c lives on CP rank s as its half j: chunks s and 2·cp−1−s (the zigzag split).
  auto source_of = [&](int c) { return c < P ? std::pair{c, 0} : std::pair{2 * P - 1 - c, 1}; };
  member_chunks.assign(static_cast<std::size_t>(G), {});
  pos_buf.clear();
  if (P == 1) {  // the plain attention reads the rows' own positions
    member_chunks[0] = {0, 1};
    return;
  }
  for (int g = 0; g < G; ++g) {
    std::vector<int>& ch = member_chunks[static_cast<std::size_t>(g)];
    for (int s = g * a2a; s < (g + 1) * a2a; ++s) ch.insert(ch.end(), {s, 2 * P - 1 - s});
    std::sort(ch.begin(), ch.end());
    std::vector<std::int32_t> mp;
    for (int c : ch) {
      const auto [s, j] = source_of(c);
      const std::vector<std::int32_t>& ps = pos.at(static_cast<std::size_t>(s));
      mp.insert(mp.end(), ps.begin() + j * C, ps.begin() + (j + 1) * C);
    }
    pos_buf.emplace_back(backend, static_cast<std::int64_t>(mp.size()), DType::i32);
    backend.upload(pos_buf.back(), mp.data());
  }
  auto make = [&](device::DeviceBuffer& b, std::int64_t n, DType type) {
    b = device::DeviceBuffer(backend, n, type);
    backend.zero(b);
  };
  const std::int64_t n = mbs * seq, qn = n * hq * dh, kvn = n * hkv * dh;
  if (G > 1) {
    make(kv_send, 2 * kvn, t);
    make(kv_recv, 2 * kvn, t);
    make(dkv_send, 2 * kvn, t);
    make(dkv_recv, 2 * kvn, t);
    make(part_out, C * (hq / a2a) * dh, t);
    make(part_lse, C * (hq / a2a), stat);  // a row statistic, like lse
  }
  if (mode == CpComm::allgather) {
    make(kv_all, 2 * kvn * P, t);
    make(dkv_all, 2 * kvn * P, t);
  }
  if (a2a == 1) return;
  // Row permutations of the all-to-all, over pieces of rows (a local row is a2a pieces of its heads):
  //   pack:   send row t·n + i  ← local piece i·a2a + t        (piece t of every row, for group rank t)
  //   unpack: member row b·L + ci·C + u ← received row t·n + b·seq + j·C + u, chunk ci of the member
  //           being half j of group rank t (L = a2a·seq rows per sequence)
  // and their inverses for the way back.
  const std::int64_t A = a2a, L = A * seq;
  std::vector<std::int32_t> pk(static_cast<std::size_t>(n * A)), pki(pk.size()), up(pk.size()), upi(pk.size());
  for (std::int64_t tt = 0; tt < A; ++tt)
    for (std::int64_t i = 0; i < n; ++i) {
      pk[static_cast<std::size_t>(tt * n + i)] = static_cast<std::int32_t>(i * A + tt);
      pki[static_cast<std::size_t>(i * A + tt)] = static_cast<std::int32_t>(tt * n + i);
    }
  const std::vector<int>& mine = member_chunks[static_cast<std::size_t>(r / a2a)];
  for (std::int64_t b = 0; b < mbs; ++b)
    for (std::size_t ci = 0; ci < mine.size(); ++ci) {
      const auto [s, j] = source_of(mine[ci]);
      const std::int64_t tt = s - (r / a2a) * a2a;
      for (std::int64_t u = 0; u < C; ++u) {
        const std::int64_t member_row = b * L + static_cast<std::int64_t>(ci) * C + u;
        const std::int64_t recv_row = tt * n + b * seq + j * C + u;
        up[static_cast<std::size_t>(member_row)] = static_cast<std::int32_t>(recv_row);
        upi[static_cast<std::size_t>(recv_row)] = static_cast<std::int32_t>(member_row);
      }
    }
  for (auto [buf, host] : {std::pair{&pack, &pk}, {&pack_inv, &pki}, {&unpack, &up}, {&unpack_inv, &upi}}) {
    *buf = device::DeviceBuffer(backend, n * A, DType::i32);
    backend.upload(*buf, host->data());
  }
  make(a2a_send, qn, t);
  make(a2a_recv, qn, t);
  make(a2a_send_stat, n * hq, stat);
  make(a2a_recv_stat, n * hq, stat);
  for (device::DeviceBuffer* b : {&mq, &mout, &mdout, &mdq}) make(*b, qn, t);
  for (device::DeviceBuffer* b : {&mk, &mv, &mdk, &mdv}) make(*b, kvn, t);
  make(mlse, n * hq, stat);
}

std::int64_t ContextParallel::bytes() const {
  std::int64_t n = 0;
  for (const device::DeviceBuffer* b : {&kv_send, &kv_recv, &kv_all, &dkv_send, &dkv_recv, &dkv_all, &part_out, &part_lse,
                                        &pack, &pack_inv, &unpack, &unpack_inv, &a2a_send, &a2a_recv, &a2a_send_stat,
                                        &a2a_recv_stat, &mq, &mk, &mv, &mout, &mlse, &mdout, &mdq, &mdk, &mdv})
    n += b->bytes();
  return n;
}

void cp_attention_forward(ContextParallel& cp, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, double scale) {
  const Timed timed{cp.seconds};
  const Level lv = level_of(cp);
  if (cp.size() == 1) return whole_forward(cp, lv, out, lse, q, k, v, qpos, scale, true);
  if (cp.a2a == 1) return level_forward(cp, lv, out, lse, q, k, v, scale);
  // All-to-all: heads scattered, the group's rows gathered; attend; out and lse back.
  const std::int64_t qw = lv.hq * cp.dh, kw = lv.hkv * cp.dh, n = cp.mbs * cp.seq;
  const std::int64_t qn = n * cp.hq * cp.dh, kvn = n * cp.hkv * cp.dh, ln = n * cp.hq;
  to_members(cp, cp.mq.at(0, qn), q, qw);
  to_members(cp, cp.mk.at(0, kvn), k, kw);
  to_members(cp, cp.mv.at(0, kvn), v, kw);
  level_forward(cp, lv, cp.mout.at(0, qn), cp.mlse.at(0, ln), cp.mq.at(0, qn), cp.mk.at(0, kvn), cp.mv.at(0, kvn), scale);
  from_members(cp, out, cp.mout.at(0, qn), qw);
  from_members(cp, lse, cp.mlse.at(0, ln), lv.hq, true);
}

void cp_attention_backward(ContextParallel& cp, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k,
                           Buf v, Buf qpos, double scale) {
  const Timed timed{cp.seconds};
  const Level lv = level_of(cp);
  if (cp.size() == 1) return whole_backward(cp, lv, dq, dk, dv, dout, out, lse, q, k, v, qpos, scale, true);
  if (cp.a2a == 1) return level_backward(cp, lv, dq, dk, dv, dout, out, lse, q, k, v, scale);
  // All-to-all: nothing head-sharded was kept, so q, k, v, out, lse and dout travel again; the head-sharded
  // gradients come back and are added to the rank's.
  device::Backend& be = *cp.be;
  const std::int64_t qw = lv.hq * cp.dh, kw = lv.hkv * cp.dh, n = cp.mbs * cp.seq;
  const std::int64_t qn = n * cp.hq * cp.dh, kvn = n * cp.hkv * cp.dh, ln = n * cp.hq;
  to_members(cp, cp.mq.at(0, qn), q, qw);
  to_members(cp, cp.mk.at(0, kvn), k, kw);
  to_members(cp, cp.mv.at(0, kvn), v, kw);
  to_members(cp, cp.mout.at(0, qn), out, qw);
  to_members(cp, cp.mdout.at(0, qn), dout, qw);
  to_members(cp, cp.mlse.at(0, ln), lse, lv.hq, true);
  be.zero(cp.mdq);
  be.zero(cp.mdk);
  be.zero(cp.mdv);
  level_backward(cp, lv, cp.mdq.at(0, qn), cp.mdk.at(0, kvn), cp.mdv.at(0, kvn), cp.mdout.at(0, qn), cp.mout.at(0, qn),
                 cp.mlse.at(0, ln), cp.mq.at(0, qn), cp.mk.at(0, kvn), cp.mv.at(0, kvn), scale);
  // mq, mk, mv are free again: the way back lands there, then adds.
  from_members(cp, cp.mq.at(0, qn), cp.mdq.at(0, qn), qw);
  from_members(cp, cp.mk.at(0, kvn), cp.mdk.at(0, kvn), kw);
  from_members(cp, cp.mv.at(0, kvn), cp.mdv.at(0, kvn), kw);
  be.add(dq.at(0, qn), cp.mq.at(0, qn));
  be.add(dk.at(0, kvn), cp.mk.at(0, kvn));
  be.add(dv.at(0, kvn), cp.mv.at(0, kvn));
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
