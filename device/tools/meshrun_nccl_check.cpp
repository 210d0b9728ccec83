// meshrun-nccl-check: every NcclComm operation at world 1 on this machine's NCCL and CUDA device (docs/gpu.md,
// "NCCL"), against the values it must leave: a one-rank communicator from ncclCommInitRank, each operation on
// device buffers on the backend's comm stream, send/receive to itself as one NCCL group. bench/gpu/check.sh runs
// it on a GPU; ctest runs it under the emulator with the fake NCCL. It links no MPI (the GPU machine has none), so
// it cannot check more than one rank: that stays with the 4-rank emulated tests until a multi-GPU machine.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "meshrun/comm/nccl.hpp"
#include "meshrun/device/backend.hpp"

namespace mc = meshrun::comm;
namespace md = meshrun::device;
using md::Buf;
using md::DType;

namespace {

std::vector<float> values(std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i + 1) + static_cast<float>(salt)) * 3.0f;
  return v;
}
// What a bf16 buffer holds for these values (the backend rounds on upload).
std::vector<float> through(md::Backend& be, const std::vector<float>& v, DType t) {
  Buf b = be.alloc(static_cast<std::int64_t>(v.size()), t);
  be.upload(b, v.data());
  std::vector<float> out(v.size());
  be.download(out.data(), b);
  be.release(b);
  return out;
}

struct Check {
  md::Backend& be;
  int passed = 0, failed = 0;
  Buf up(const std::vector<float>& v, DType t = DType::f32) {
    Buf b = be.alloc(static_cast<std::int64_t>(v.size()), t);
    be.upload(b, v.data());
    return b;
  }
  std::vector<float> down(Buf b) {
    std::vector<float> v(static_cast<std::size_t>(b.n));
    be.download(v.data(), b);
    return v;
  }
  void expect(const char* what, const std::function<bool()>& body) {
    const auto t0 = std::chrono::steady_clock::now();
    bool ok = false;
    std::string error;
    try {
      ok = body();
    } catch (const std::exception& e) {
      error = e.what();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    (ok ? passed : failed)++;
    std::printf("  %s %-58s %8.2f ms%s%s\n", ok ? "ok  " : "FAIL", what, ms, error.empty() ? "" : "  ", error.c_str());
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 1 << 20;   // 1 Mi elements per buffer (4 MiB in fp32)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--elements" && i + 1 < argc) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(argv[++i], &end, 10);
      if (*end != '\0' || v < 8 || v > (1ull << 30)) {
        std::fprintf(stderr, "meshrun-nccl-check: --elements %s is not a count in 8..2^30\n", argv[i]);
        return 2;
      }
      n = static_cast<std::size_t>(v);
    } else if (a == "--help") {
      std::printf("usage: meshrun-nccl-check [--elements N]   (every NcclComm operation at world 1; default N = 1048576)\n");
      return 0;
    } else {
      std::fprintf(stderr, "meshrun-nccl-check: unknown argument %s; use --elements N or --help\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  const int visible = md::cuda_device_count(&why);
  if (visible == 0) {
    std::fprintf(stderr, "meshrun-nccl-check: no CUDA device: %s\n", why.c_str());
    return 2;
  }
  std::unique_ptr<md::Backend> be;
  std::unique_ptr<mc::Comm> c;
  try {
    be = md::make_cuda_backend(md::Precision::cuda("bf16", "fp32", "fp32"), md::task_cuda_device(visible));
    c = mc::make_nccl_self_comm(*be);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "meshrun-nccl-check: %s\n", e.what());
    return 2;
  }
  std::printf("nccl-check: NCCL %s on %s, %zu elements per buffer, one rank\n", mc::nccl_version().c_str(),
              be->name().c_str(), n);
  Check k{*be};
  const std::vector<float> x = values(n, 1), y = values(n, 2);
  k.expect("all_reduce sum fp32 in place (one rank: left unchanged)", [&] {
    Buf b = k.up(x);
    c->all_reduce(b, mc::ReduceOp::sum);
    const bool ok = k.down(b) == x;
    be->release(b);
    return ok;
  });
  k.expect("all_reduce max bf16 in place", [&] {
    Buf b = k.up(x, DType::bf16);
    c->all_reduce(b, mc::ReduceOp::max);
    const bool ok = k.down(b) == through(*be, x, DType::bf16);
    be->release(b);
    return ok;
  });
  k.expect("all_reduce sum fp64 in place", [&] {
    std::vector<double> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = x[i];
    Buf b = be->alloc(static_cast<std::int64_t>(n), DType::f64);
    be->upload(b, h.data());
    c->all_reduce(b, mc::ReduceOp::sum);
    std::vector<double> out(n);
    be->download(out.data(), b);
    be->release(b);
    return out == h;
  });
  k.expect("reduce_scatter fp32 (out of place, non-blocking)", [&] {
    Buf s = k.up(x), r = be->alloc(static_cast<std::int64_t>(n), DType::f32);
    mc::Request q = c->ireduce_scatter(s, r, mc::ReduceOp::sum);
    q.wait();
    const bool ok = k.down(r) == x;
    be->release(s);
    be->release(r);
    return ok;
  });
  k.expect("all_gather bf16 (out of place, non-blocking)", [&] {
    Buf s = k.up(y, DType::bf16), r = be->alloc(static_cast<std::int64_t>(n), DType::bf16);
    c->iall_gather(s, r).wait();
    const bool ok = k.down(r) == through(*be, y, DType::bf16);
    be->release(s);
    be->release(r);
    return ok;
  });
  k.expect("broadcast fp32 from rank 0", [&] {
    Buf b = k.up(y);
    c->broadcast(b, 0);
    const bool ok = k.down(b) == y;
    be->release(b);
    return ok;
  });
  k.expect("isend + irecv to itself (one NCCL group at the wait)", [&] {
    Buf s = k.up(x), r = be->alloc(static_cast<std::int64_t>(n), DType::f32);
    mc::Request rx = c->irecv(r, 0, 0);
    mc::Request tx = c->isend(s, 0, 0);
    rx.wait();
    tx.wait();
    const bool ok = k.down(r) == x;
    be->release(s);
    be->release(r);
    return ok;
  });
  k.expect("all_to_all with counts to itself (grouped send/receive)", [&] {
    const std::int64_t half = static_cast<std::int64_t>(n / 2);
    Buf s = k.up(y), r = be->alloc(static_cast<std::int64_t>(n), DType::f32);
    be->zero(r);
    c->all_to_all(s.at(0, half), &half, r.at(0, half), &half);
    const std::vector<float> got = k.down(r);
    bool ok = std::memcmp(got.data(), y.data(), static_cast<std::size_t>(half) * sizeof(float)) == 0;
    for (std::size_t i = static_cast<std::size_t>(half); i < n && ok; ++i) ok = got[i] == 0.0f;
    be->release(s);
    be->release(r);
    return ok;
  });
  k.expect("host buffers through the same communicator (not NCCL)", [&] {
    double v = 3.5;
    c->all_reduce(&v, 1);
    return v == 3.5;
  });
  be->synchronize();
  std::printf("nccl-check: %d of %d operations ok at world 1%s\n", k.passed, k.passed + k.failed,
              k.failed ? "" : " (more ranks, NVLink and InfiniBand: not checked by this binary)");
  return k.failed ? 1 : 0;
}
