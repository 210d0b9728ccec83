// Upper bounds on every size a template, flag, environment variable or hostlist may give. They are far above
// any real job and chosen so that every derived product (world, pipeline chunks, 2·cp, per-step batch, …)
// fits a 32-bit int; the config layer and resolve_cluster/resolve_layout check them before anything is
// allocated or looped over. docs/mesh.md ("Limits") says why each one is what it is.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace meshrun::limits {

inline constexpr int64_t kWorld = int64_t(1) << 24;        // ranks (GPUs) of one job: 16,777,216
inline constexpr int64_t kHosts = int64_t(1) << 22;        // hosts (nodes) of one job or hostlist: 4,194,304
inline constexpr int64_t kHostlistBytes = int64_t(1) << 26;  // expanded hostlist text, 64 MiB
inline constexpr int64_t kGpusPerNode = 1024;
inline constexpr int64_t kNvlinkDomainGpus = 1 << 16;      // GB200 NVL576 is 576
inline constexpr int64_t kLayers = 1 << 10;  // DeepNet trained 1,000 layers; also bounds pp·virtual_stages
inline constexpr int64_t kExperts = 1 << 16;
inline constexpr int64_t kWidth = 1 << 20;                 // hidden, ffn_hidden, moe_ffn_hidden
inline constexpr int64_t kHeads = 1 << 16;                 // heads, kv_heads
inline constexpr int64_t kVocab = int64_t(1) << 32;
inline constexpr int64_t kSeqLen = 1 << 24;                // tokens per sequence
inline constexpr int64_t kBatch = 1 << 30;                 // global and micro batch, in sequences

// The product of sizes, saturating at INT64_MAX (each axis may be up to kWorld: four of them overflow int64).
inline int64_t product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return INT64_MAX;
  return p;
}

}  // namespace meshrun::limits
