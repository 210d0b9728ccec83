// splitmix64: a tiny reproducible generator for the device check's inputs and token streams.
// (std::mt19937_64 would pull libstdc++'s random.o into the statically linked check binary, and with it a
// glibc 2.36 symbol the GPU machine may lack.)
#pragma once
#include <cstdint>

namespace meshrun::device {

struct SplitMix64 {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }   // [0, 1)
  std::int64_t below(std::int64_t n) { return static_cast<std::int64_t>(uniform() * static_cast<double>(n)); }
};

}  // namespace meshrun::device
