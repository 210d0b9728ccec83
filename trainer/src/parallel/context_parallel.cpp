#include "meshrun/train/parallel/context_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "meshrun/kernels/cpu.hpp"

namespace meshrun::train {

namespace kc = meshrun::kernels::cpu;

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
template <class T, class F>
void for_visible_pairs(const ContextParallel<T>& cp, int s, F&& f) {
  const int P = cp.size(), r = cp.rank();
  const std::int64_t C = cp.seq / 2;
  for (std::int64_t b = 0; b < cp.mbs; ++b)
    for (int j = 0; j < 2; ++j)
      for (int kk = 0; kk < 2; ++kk) {
        const int qc = chunk_of(r, j, P), kc = chunk_of(s, kk, P);
        if (kc > qc) continue;  // the whole key chunk lies after the query chunk: fully masked
        f(b * cp.seq + j * C, b * cp.seq + kk * C, cp.pos[r].data() + j * C, cp.pos[s].data() + kk * C, kc == qc);
      }
}

template <class T>
void attend_block(ContextParallel<T>& cp, T* out, T* lse, std::vector<char>& have, const T* q, const T* kblk,
                  const T* vblk, int s, double scale) {
  const std::int64_t C = cp.seq / 2, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const kc::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, s, [&](std::int64_t qr, std::int64_t kr, const std::int32_t* qp, const std::int32_t* kp, bool diag) {
    T* o = out + qr * hq * dh;
    T* l = lse + qr * hq;
    const std::size_t slot = static_cast<std::size_t>(qr / C);
    if (!have[slot]) {
      kc::attention_forward(o, l, q + qr * hq * dh, kblk + kr * hkv * dh, vblk + kr * hkv * dh, qp, kp, ad, scale);
      have[slot] = 1;
    } else {
      kc::attention_forward(cp.part_out.data(), cp.part_lse.data(), q + qr * hq * dh, kblk + kr * hkv * dh,
                            vblk + kr * hkv * dh, qp, kp, ad, scale);
      kc::attention_merge(o, l, cp.part_out.data(), cp.part_lse.data(), C * hq, dh);
    }
    cp.pairs += diag ? C * (C + 1) / 2 : C * C;
  });
}

template <class T>
void attend_block_backward(ContextParallel<T>& cp, T* dq, T* dkblk, T* dvblk, const T* dout, const T* out,
                           const T* lse, const T* q, const T* kblk, const T* vblk, int s, double scale) {
  const std::int64_t C = cp.seq / 2, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const kc::AttentionDims ad{C, C, hq, hkv, dh};
  for_visible_pairs(cp, s, [&](std::int64_t qr, std::int64_t kr, const std::int32_t* qp, const std::int32_t* kp, bool) {
    const std::int64_t qo = qr * hq * dh, ko = kr * hkv * dh;
    kc::attention_backward(dq + qo, dkblk + ko, dvblk + ko, dout + qo, out + qo, lse + qr * hq, q + qo, kblk + ko,
                           vblk + ko, qp, kp, ad, scale);
  });
}
}  // namespace

template <class T>
void ContextParallel<T>::resize() {
  const std::int64_t kvn = mbs * seq * hkv * dh;
  const int P = size();
  if (P == 1) return;
  kv_send.assign(static_cast<std::size_t>(2 * kvn), T(0));
  kv_recv.assign(static_cast<std::size_t>(2 * kvn), T(0));
  dkv_send.assign(static_cast<std::size_t>(2 * kvn), T(0));
  dkv_recv.assign(static_cast<std::size_t>(2 * kvn), T(0));
  if (mode == CpComm::allgather) {
    kv_all.assign(static_cast<std::size_t>(2 * kvn * P), T(0));
    dkv_all.assign(static_cast<std::size_t>(2 * kvn * P), T(0));
  }
  part_out.assign(static_cast<std::size_t>(seq / 2 * hq * dh), T(0));
  part_lse.assign(static_cast<std::size_t>(seq / 2 * hq), T(0));
}

template <class T>
void cp_attention_forward(ContextParallel<T>& cp, T* out, T* lse, const T* q, const T* k, const T* v,
                          const std::int32_t* qpos, double scale) {
  const Timed timed{cp.seconds};
  const std::int64_t S = cp.seq, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    const kc::AttentionDims ad{S, S, hq, hkv, dh};
    for (std::int64_t b = 0; b < cp.mbs; ++b)
      kc::attention_forward(out + b * S * hq * dh, lse + b * S * hq, q + b * S * hq * dh, k + b * S * hkv * dh,
                            v + b * S * hkv * dh, qpos + b * S, qpos + b * S, ad, scale);
    cp.pairs += cp.mbs * S * (S + 1) / 2;
    return;
  }
  const std::int64_t kvn = cp.mbs * S * hkv * dh;
  std::vector<char> have(static_cast<std::size_t>(cp.mbs * 2), 0);
  if (cp.mode == CpComm::allgather) {
    std::copy(k, k + kvn, cp.kv_send.data());
    std::copy(v, v + kvn, cp.kv_send.data() + kvn);
    cp.cp->all_gather(cp.kv_send.data(), cp.kv_all.data(), 2 * kvn);
    for (int i = 0; i < P; ++i) {
      const int s = (r - i + P) % P;
      const T* blk = cp.kv_all.data() + static_cast<std::int64_t>(s) * 2 * kvn;
      attend_block(cp, out, lse, have, q, blk, blk + kvn, s, scale);
    }
    return;
  }
  std::copy(k, k + kvn, cp.kv_send.data());
  std::copy(v, v + kvn, cp.kv_send.data() + kvn);
  for (int i = 0; i < P; ++i) {
    const int s = (r - i + P) % P;
    Request rx, tx;
    if (i < P - 1) {  // the next block travels while this one is computed
      rx = cp.cp->irecv(host_buf(cp.kv_recv.data(), 2 * kvn), cp.prev, kTagKv);
      tx = cp.cp->isend(host_buf(cp.kv_send.data(), 2 * kvn), cp.next, kTagKv);
    }
    attend_block(cp, out, lse, have, q, cp.kv_send.data(), cp.kv_send.data() + kvn, s, scale);
    rx.wait();
    tx.wait();
    std::swap(cp.kv_send, cp.kv_recv);
  }
}

template <class T>
void cp_attention_backward(ContextParallel<T>& cp, T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse,
                           const T* q, const T* k, const T* v, const std::int32_t* qpos, double scale) {
  const Timed timed{cp.seconds};
  const std::int64_t S = cp.seq, hq = cp.hq, hkv = cp.hkv, dh = cp.dh;
  const int P = cp.size(), r = cp.rank();
  if (P == 1) {
    const kc::AttentionDims ad{S, S, hq, hkv, dh};
    for (std::int64_t b = 0; b < cp.mbs; ++b) {
      const std::int64_t oq = b * S * hq * dh, okv = b * S * hkv * dh;
      kc::attention_backward(dq + oq, dk + okv, dv + okv, dout + oq, out + oq, lse + b * S * hq, q + oq, k + okv,
                             v + okv, qpos + b * S, qpos + b * S, ad, scale);
    }
    return;
  }
  const std::int64_t kvn = cp.mbs * S * hkv * dh;
  std::copy(k, k + kvn, cp.kv_send.data());
  std::copy(v, v + kvn, cp.kv_send.data() + kvn);
  if (cp.mode == CpComm::allgather) {
    // K/V were not kept from the forward: gather them again; each rank's dK/dV contributions to every
    // block are reduce-scattered to the block's owner (fixed rank order).
    cp.cp->all_gather(cp.kv_send.data(), cp.kv_all.data(), 2 * kvn);
    std::fill(cp.dkv_all.begin(), cp.dkv_all.end(), T(0));
    for (int i = 0; i < P; ++i) {
      const int s = (r - i + P) % P;
      const T* blk = cp.kv_all.data() + static_cast<std::int64_t>(s) * 2 * kvn;
      T* dblk = cp.dkv_all.data() + static_cast<std::int64_t>(s) * 2 * kvn;
      attend_block_backward(cp, dq, dblk, dblk + kvn, dout, out, lse, q, blk, blk + kvn, s, scale);
    }
    cp.cp->reduce_scatter(cp.dkv_all.data(), cp.dkv_recv.data(), 2 * kvn);
    for (std::int64_t i = 0; i < kvn; ++i) {
      dk[i] += cp.dkv_recv[i];
      dv[i] += cp.dkv_recv[kvn + i];
    }
    return;
  }
  // Ring: block s travels with its dK/dV accumulator; after P hops the accumulator is home.
  std::fill(cp.dkv_send.begin(), cp.dkv_send.end(), T(0));
  for (int i = 0; i < P; ++i) {
    const int s = (r - i + P) % P;
    Request rx, tx;
    if (i < P - 1) {
      rx = cp.cp->irecv(host_buf(cp.kv_recv.data(), 2 * kvn), cp.prev, kTagKv);
      tx = cp.cp->isend(host_buf(cp.kv_send.data(), 2 * kvn), cp.next, kTagKv);
    }
    attend_block_backward(cp, dq, cp.dkv_send.data(), cp.dkv_send.data() + kvn, dout, out, lse, q,
                          cp.kv_send.data(), cp.kv_send.data() + kvn, s, scale);
    cp.cp->sendrecv(host_buf(cp.dkv_send.data(), 2 * kvn), cp.next, host_buf(cp.dkv_recv.data(), 2 * kvn), cp.prev, kTagDkv);
    std::swap(cp.dkv_send, cp.dkv_recv);
    rx.wait();
    tx.wait();
    std::swap(cp.kv_send, cp.kv_recv);
  }
  for (std::int64_t i = 0; i < kvn; ++i) {
    dk[i] += cp.dkv_send[i];
    dv[i] += cp.dkv_send[kvn + i];
  }
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

#define MESHRUN_CP_INSTANTIATE(T)                                                                                  \
  template struct ContextParallel<T>;                                                                              \
  template void cp_attention_forward<T>(ContextParallel<T>&, T*, T*, const T*, const T*, const T*,                 \
                                        const std::int32_t*, double);                                              \
  template void cp_attention_backward<T>(ContextParallel<T>&, T*, T*, T*, const T*, const T*, const T*, const T*,  \
                                         const T*, const T*, const std::int32_t*, double);
MESHRUN_CP_INSTANTIATE(float)
MESHRUN_CP_INSTANTIATE(double)
#undef MESHRUN_CP_INSTANTIATE

}  // namespace meshrun::train
