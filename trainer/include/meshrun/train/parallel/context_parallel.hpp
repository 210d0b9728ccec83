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
//   alltoall (cp_comm = "alltoall", DeepSpeed Ulysses, Megatron's a2a): q, k, v are all-to-all'ed from
//        sequence-sharded [rows, heads] to head-sharded [whole sequence, heads/cp] (the rows put back in
//        sequence order), each rank attends its heads over the whole sequence in one causal call per
//        sequence (the single process's own call, so the same bits per head), and out, lse go back the
//        same way. The backward sends q, k, v, out, lse, dout again (nothing head-sharded is kept) and
//        returns dq, dk, dv. Needs the rank's heads and kv heads divisible by cp.
//   alltoall+ring (Megatron's a2a+p2p): all-to-all inside groups of cp_alltoall consecutive CP ranks,
//        then a ring across the cp/cp_alltoall groups: a group's "ring member" holds the chunks of its
//        ranks (zigzag pairs, so still balanced), for heads/cp_alltoall heads, and the ring above runs
//        among the ranks with the same place in their groups, chunk pair by chunk pair.
// The ring and all-gather are one "level" with cp members of 2 chunks; alltoall is one member holding
// every chunk; alltoall+ring has cp/cp_alltoall members of 2·cp_alltoall chunks each.
// With cp = 1 this is the plain per-sequence causal attention.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/device/backend.hpp"
#include "meshrun/train/comm_names.hpp"

namespace meshrun::train {

enum class CpComm { ring, allgather, alltoall, alltoall_ring };

// parallel.cp_comm's spelling: "ring", "allgather", "alltoall", "alltoall+ring"; nullopt otherwise.
std::optional<CpComm> parse_cp_comm(const std::string& s);

struct ContextParallel {
  Comm* cp = nullptr;
  device::Backend* be = nullptr;
  CpComm mode = CpComm::ring;
  int prev = 0, next = 0;                       // ring neighbours in the cp group (mesh's ring_peers, or under
                                                // alltoall_ring mesh's cp_alltoall_place: across the groups)
  int a2a = 1;                                  // all-to-all group size: 1, cp (alltoall) or cp_alltoall
  std::vector<std::vector<std::int32_t>> pos;   // [cp rank] global positions of its rows of one sequence
  std::int64_t seq = 0;                         // local rows per sequence (S / cp)
  std::int64_t mbs = 0, hq = 0, hkv = 0, dh = 0;
  // Made by resize(): per ring member its chunks (global chunk ids, C = S/2cp rows each, in row order)
  // and the positions of its rows of one sequence; the all-to-all's row permutations and scratch.
  std::vector<std::vector<int>> member_chunks;
  std::vector<device::DeviceBuffer> pos_buf;
  device::DeviceBuffer kv_send, kv_recv, kv_all, dkv_send, dkv_recv, dkv_all, part_out, part_lse;
  device::DeviceBuffer pack, pack_inv, unpack, unpack_inv;          // int32 row indices (all-to-all)
  device::DeviceBuffer a2a_send, a2a_recv, a2a_send_stat, a2a_recv_stat;
  device::DeviceBuffer mq, mk, mv, mout, mlse, mdout, mdq, mdk, mdv;  // head-sharded, whole sequences
  // Visible (query, key) pairs computed, weighted by the share of the rank's heads they were computed
  // for (× heads computed / hq, summed as pair·heads: see visible_pairs()), over all calls: the
  // causal-attention work counter; and the seconds spent in attention (forward and backward,
  // communication included).
  std::int64_t pair_heads = 0;
  double seconds = 0;
  std::int64_t visible_pairs() const { return hq > 0 ? pair_heads / hq : 0; }

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
