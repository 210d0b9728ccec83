// Context parallelism: causal attention of one micro-batch when its sequences are split over the CP group
// (parallelism.md §5). Everything else in a layer is row-wise, so this is the only place CP enters.
//
// Zigzag split (mesh's BatchGeometry::cp_positions): a sequence of S tokens is cut into 2·cp chunks of
// C = S/(2·cp); CP rank r holds chunks r and 2·cp−1−r, so under the causal mask every rank has the same
// work. Local rows of a sequence: [chunk r | chunk 2cp−1−r], C each.
//
//   sequence:  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |        cp = 4, 8 chunks
//   rank 0:      0                           7
//   rank 1:          1                   6
//   rank 2:              2           5
//   rank 3:                  3   4
//
// Attention of the local queries against every rank's K/V block, one (query chunk, key chunk) pair at a
// time: a pair whose key chunk comes after the query chunk is fully masked and skipped; the diagonal
// pair is causal; the rest is full. Partial results merge through the log-sum-exp
// (kernels' attention_merge), in a fixed order of blocks: own first, then the block of rank r−1, r−2, …
//   ring (cp_comm = "ring"): K/V blocks travel around the CP ring (non-blocking, the next block's
//        transfer posted before the current block is computed); in backward they travel again with
//        their dK/dV accumulators, which after cp hops are back at their owner.
//   allgather (cp_comm = "allgather", Llama 3's): K/V are all-gathered, the same pairs are computed in
//        the same order (so the forward is bit-identical to the ring's), and in backward K/V are gathered
//        again (not kept: saves (cp−1)/cp of the gathered K/V per layer) and dK/dV reduce-scattered.
// With cp = 1 this is the plain per-sequence causal attention.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/train/comm_names.hpp"

namespace meshrun::train {

enum class CpComm { ring, allgather };

struct ContextParallel {
  Comm* cp = nullptr;
  device::Backend* be = nullptr;
  CpComm mode = CpComm::ring;
  int prev = 0, next = 0;                       // ring neighbours in the cp group (mesh's ring_peers)
  std::vector<std::vector<std::int32_t>> pos;   // [cp rank] global positions of its rows of one sequence
  std::int64_t seq = 0;                         // local rows per sequence (S / cp)
  std::int64_t mbs = 0, hq = 0, hkv = 0, dh = 0;
  // Backend buffers (made by resize()): every CP rank's positions, and scratch.
  std::vector<device::DeviceBuffer> pos_buf;
  device::DeviceBuffer kv_send, kv_recv, kv_all, dkv_send, dkv_recv, dkv_all, part_out, part_lse;
  // Visible (query, key) pairs this rank computed, summed over calls: the causal-attention work counter;
  // and the seconds spent in attention (forward and backward, communication included).
  std::int64_t pairs = 0;
  double seconds = 0;

  int size() const { return cp ? cp->size() : 1; }
  int rank() const { return cp ? cp->rank() : 0; }
  void resize(device::Backend& backend);
  std::int64_t bytes() const;  // of the scratch
};

// out, lse: overwrite. q [n, hq, dh], k/v [n, hkv, dh] local rows (n = mbs·seq); qpos = the local positions.
void cp_attention_forward(ContextParallel& cp, Buf out, Buf lse, Buf q, Buf k, Buf v, Buf qpos, double scale);
// dq, dk, dv: ACCUMULATE this rank's q/k/v gradients (dk, dv of its own K/V block, from every rank's queries).
void cp_attention_backward(ContextParallel& cp, Buf dq, Buf dk, Buf dv, Buf dout, Buf out, Buf lse, Buf q, Buf k,
                           Buf v, Buf qpos, double scale);

// Visible causal (query, key) pairs per CP rank of one sequence of S tokens: zigzag (the trainer's) or a
// contiguous split (rank r holds [r·S/cp, (r+1)·S/cp)), for the load-balance report.
std::vector<std::int64_t> causal_pairs_per_rank(std::int64_t seq_len, int cp, bool zigzag);

}  // namespace meshrun::train
