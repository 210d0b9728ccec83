// NcclComm on the CUDA backend over the fake NCCL, under mpirun (nccl.sh runs each mode):
//   ops      every operation on device buffers against MpiComm's on host copies of the same data, each rank's
//            result identical across ranks; host buffers through the same NcclComm; the group -> communicator
//            mapping of a tp2 x dp2 grid (each NCCL group gathers its members' world ranks)
//   reorder | count | unmatched | split | destroyed | host_memory | abort
//            one broken NCCL rule each: the fake's line (or the returned error) is what nccl.sh checks
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshrun/comm/mpi.hpp"
#include "meshrun/comm/nccl_groups.hpp"
#include "meshrun/device/backend.hpp"
#include "meshrun/layout.hpp"
#include "nccl.h"   // the fake NCCL's, for the rules NcclComm cannot be made to break

namespace mc = meshrun::comm;
namespace md = meshrun::device;
using md::Buf;
using md::DType;

namespace {

int g_rank = 0, g_size = 1;
int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: FAILED %s\n", g_rank, what.c_str());
  }
}

std::unique_ptr<md::Backend> backend() {
  return md::make_cuda_backend(md::Precision::for_run("cuda", "fp32", "fp32", "fp32", "fp32"), g_rank);
}

// Device buffer of n floats from host values, and back.
Buf upload(md::Backend& be, const std::vector<float>& v, DType t = DType::f32) {
  Buf b = be.alloc(static_cast<std::int64_t>(v.size()), t);
  be.upload(b, v.data());
  return b;
}
std::vector<float> download(md::Backend& be, Buf b) {
  std::vector<float> v(static_cast<std::size_t>(b.n));
  be.download(v.data(), b);
  return v;
}
std::vector<float> values(std::size_t n, int salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i + 1) * static_cast<float>(salt + 1)) * 3.0f;
  return v;
}
float max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  float m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(b[i])));
  return a.size() == b.size() ? m : 1e30f;
}
// Every rank of `c` holds the same bits in v.
bool same_everywhere(mc::Comm& host, const std::vector<float>& v) {
  std::vector<float> all(v.size() * static_cast<std::size_t>(host.size()));
  host.all_gather(v.data(), all.data(), static_cast<std::int64_t>(v.size()));
  for (int r = 0; r < host.size(); ++r)
    if (std::memcmp(all.data() + v.size() * r, v.data(), v.size() * sizeof(float)) != 0) return false;
  return true;
}

meshrun::RankGrid grid_tp2_dp2() {
  meshrun::Layout l;
  l.tp = 2;
  l.dp = g_size / 2;
  return meshrun::RankGrid(l);
}

int run_ops() {
  auto be = backend();
  const meshrun::RankGrid grid = grid_tp2_dp2();
  mc::Groups g = mc::make_nccl_groups(MPI_COMM_WORLD, grid, *be, g_rank);
  mc::MpiComm ref(MPI_COMM_WORLD, false);
  mc::Comm& w = *g.world;
  expect(g.device_memory, "groups move device memory");
  expect(w.size() == g_size && w.rank() == g_rank, "world size and rank");
  const std::size_t n = 1000 + 7;   // not a multiple of the ranks: the fake's ring blocks are uneven

  // all_reduce sum and max, fp32 and bf16, against MPI's fixed-order sums on the host (within rounding).
  for (auto op : {mc::ReduceOp::sum, mc::ReduceOp::max}) {
    std::vector<float> mine = values(n, g_rank), want = mine;
    ref.all_reduce(want.data(), static_cast<std::int64_t>(n), op);
    Buf d = upload(*be, mine);
    w.all_reduce(d, op);
    const std::vector<float> got = download(*be, d);
    expect(max_rel(got, want) < 1e-6f, std::string("all_reduce fp32 ") + (op == mc::ReduceOp::sum ? "sum" : "max"));
    expect(same_everywhere(ref, got), "all_reduce: identical bits on every rank");
    Buf h = upload(*be, mine, DType::bf16);
    w.all_reduce(h, op);
    // bf16: inputs rounded to 8 bits, then a rounding per ring step: within 2^-8 per step of the magnitudes.
    const float err = max_rel(download(*be, h), want);
    expect(err < 4 * g_size * 3.0f / 256, "all_reduce bf16 (error " + std::to_string(err) + ")");
    be->release(d);
    be->release(h);
  }
  // reduce_scatter (out of place and in place) == the matching block of all_reduce; all_gather (both forms).
  {
    const std::size_t block = 64;
    std::vector<float> mine = values(block * g_size, g_rank + 10), sum = mine;
    ref.all_reduce(sum.data(), static_cast<std::int64_t>(sum.size()));
    Buf s = upload(*be, mine), r = be->alloc(static_cast<std::int64_t>(block), DType::f32);
    w.reduce_scatter(s, r, mc::ReduceOp::sum);
    const std::vector<float> want(sum.begin() + static_cast<long>(block * g_rank), sum.begin() + static_cast<long>(block * (g_rank + 1)));
    expect(max_rel(download(*be, r), want) < 1e-6f, "reduce_scatter");
    mc::Request q = w.ireduce_scatter(s, s.at(static_cast<std::int64_t>(block) * g_rank, static_cast<std::int64_t>(block)), mc::ReduceOp::sum);
    q.wait();
    const std::vector<float> inplace = download(*be, s);
    expect(max_rel(std::vector<float>(inplace.begin() + static_cast<long>(block * g_rank), inplace.begin() + static_cast<long>(block * (g_rank + 1))), want) < 1e-6f,
           "ireduce_scatter in place");
    Buf all = be->alloc(static_cast<std::int64_t>(block * g_size), DType::f32);
    w.all_gather(r, all);
    const std::vector<float> gathered = download(*be, all);
    expect(max_rel(gathered, sum) < 1e-6f, "all_gather");
    w.iall_gather(all.at(static_cast<std::int64_t>(block) * g_rank, static_cast<std::int64_t>(block)), all).wait();
    expect(download(*be, all) == gathered, "iall_gather in place");
    be->release(s);
    be->release(r);
    be->release(all);
  }
  // broadcast from the last rank.
  {
    Buf b = upload(*be, values(n, g_rank + 20));
    w.broadcast(b, g_size - 1);
    expect(download(*be, b) == values(n, g_size - 1 + 20), "broadcast");
    be->release(b);
  }
  // A ring: receive from the previous rank, send to the next (both queued, launched as one group at the wait).
  {
    const int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
    Buf s = upload(*be, values(n, g_rank + 30)), r = be->alloc(static_cast<std::int64_t>(n), DType::f32);
    mc::Request rx = w.irecv(r, prev, 0);
    mc::Request tx = w.isend(s, next, 0);
    rx.wait();
    tx.wait();
    expect(download(*be, r) == values(n, prev + 30), "ring isend/irecv");
    w.sendrecv(r, next, s, prev, 0);
    expect(download(*be, s) == values(n, (prev + g_size - 1) % g_size + 30), "sendrecv");
    be->release(s);
    be->release(r);
  }
  // all_to_all with counts: rank r sends (r + p) % 3 elements to p (zero counts included).
  {
    std::vector<std::int64_t> sc(g_size), rc(g_size);
    std::int64_t st = 0, rt = 0;
    for (int p = 0; p < g_size; ++p) {
      sc[p] = (g_rank + p) % 3;
      rc[p] = (p + g_rank) % 3;
      st += sc[p];
      rt += rc[p];
    }
    std::vector<float> mine(static_cast<std::size_t>(std::max<std::int64_t>(st, 1)));
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(100 * g_rank + static_cast<int>(i));
    std::vector<float> want(static_cast<std::size_t>(std::max<std::int64_t>(rt, 1)));
    ref.all_to_all(md::host_buf(mine.data(), st), sc.data(), md::host_buf(want.data(), rt), rc.data());
    Buf s = upload(*be, mine), r = be->alloc(std::max<std::int64_t>(rt, 1), DType::f32);
    w.all_to_all(s.at(0, st), sc.data(), r.at(0, rt), rc.data());
    std::vector<float> got = download(*be, r);
    got.resize(static_cast<std::size_t>(rt));
    want.resize(static_cast<std::size_t>(rt));
    expect(got == want, "all_to_all with counts");
    be->release(s);
    be->release(r);
  }
  // Host buffers through the same communicators go to MPI.
  {
    double x = g_rank + 1.0;
    w.all_reduce(&x, 1);
    expect(x == g_size * (g_size + 1) / 2.0, "host all_reduce through NcclComm");
    std::vector<int> counts(static_cast<std::size_t>(g_size));
    int mine = g_rank * 7;
    w.all_gather(&mine, counts.data(), 1);
    expect(counts.back() == (g_size - 1) * 7, "host all_gather through NcclComm");
  }
  // Group -> communicator: each group's NCCL communicator gathers its members' world ranks in grid order.
  for (meshrun::GroupKind k : meshrun::kGroupKinds) {
    mc::Comm& c = g[k];
    const std::vector<int> members = grid.group_of(g_rank, k);
    expect(c.size() == static_cast<int>(members.size()) && c.rank() == grid.index_in_group(g_rank, k),
           std::string("size and rank of group ") + meshrun::group_name(k));
    Buf mine = upload(*be, {static_cast<float>(g_rank)});
    Buf all = be->alloc(c.size(), DType::f32);
    c.all_gather(mine, all);
    std::vector<float> want(members.begin(), members.end());
    expect(download(*be, all) == want, std::string("members of group ") + meshrun::group_name(k) + " (NCCL)");
    be->release(mine);
    be->release(all);
  }
  be->synchronize();
  if (g_rank == 0) std::printf("nccl ops: %s (%d ranks, NCCL %s)\n", failures ? "FAILED" : "ok", g_size, mc::nccl_version().c_str());
  return failures ? 1 : 0;
}

// The rule cases: each does what real NCCL would hang or corrupt on.
int run_rule(const std::string& mode) {
  auto be = backend();
  const meshrun::RankGrid grid = grid_tp2_dp2();
  mc::Groups g = mc::make_nccl_groups(MPI_COMM_WORLD, grid, *be, g_rank);
  mc::Comm& w = *g.world;
  Buf a = upload(*be, values(256, g_rank));
  Buf b = be->alloc(256 * g_size, DType::f32);
  if (mode == "reorder") {          // rank 1 launches its two collectives the other way round
    if (g_rank == 1) {
      w.all_gather(a, b);
      w.all_reduce(a, mc::ReduceOp::sum);
    } else {
      w.all_reduce(a, mc::ReduceOp::sum);
      w.all_gather(a, b);
    }
  } else if (mode == "count") {     // rank 1 reduces fewer elements
    w.all_reduce(a.at(0, g_rank == 1 ? 128 : 256), mc::ReduceOp::sum);
  } else if (mode == "unmatched") { // rank 0 sends to rank 1, which never receives
    if (g_rank == 0) w.send(a, 1, 0);
    else std::this_thread::sleep_for(std::chrono::seconds(30));
  } else if (mode == "split") {     // every rank splits the world but rank 1, which reduces instead
    ncclUniqueId id{};
    if (g_rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t world = nullptr, sub = nullptr;
    ncclCommInitRank(&world, g_size, id, g_rank);
    cudaStream_t st = static_cast<cudaStream_t>(be->native_stream(md::Backend::Stream::comm));
    if (g_rank == 1) ncclAllReduce(a.p, a.p, 256, ncclFloat32, ncclSum, world, st);
    else ncclCommSplit(world, 0, g_rank, &sub, nullptr);
  } else if (mode == "destroyed") { // a collective on a communicator after ncclCommDestroy
    ncclUniqueId id{};
    if (g_rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t world = nullptr;
    ncclCommInitRank(&world, g_size, id, g_rank);
    ncclCommDestroy(world);
    ncclAllReduce(a.p, a.p, 256, ncclFloat32, ncclSum, world, static_cast<cudaStream_t>(be->native_stream(md::Backend::Stream::comm)));
  } else if (mode == "host_memory") { // NCCL given host memory: an error returned (not a crash); NcclComm refuses a mixed pair
    std::vector<float> host(256, 1.0f);
    ncclUniqueId id{};
    if (g_rank == 0) ncclGetUniqueId(&id);
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    ncclComm_t world = nullptr;
    ncclCommInitRank(&world, g_size, id, g_rank);
    const ncclResult_t r = ncclAllReduce(host.data(), host.data(), 256, ncclFloat32, ncclSum, world,
                                         static_cast<cudaStream_t>(be->native_stream(md::Backend::Stream::comm)));
    std::printf("rank %d: ncclAllReduce on host memory: %s: %s\n", g_rank, ncclGetErrorString(r), ncclGetLastError(world));
    try {
      w.all_gather(md::host_buf(host.data(), 256), b);
      std::printf("rank %d: NcclComm took a mixed pair\n", g_rank);
      return 1;
    } catch (const std::logic_error& e) {
      std::printf("rank %d: NcclComm refused: %s\n", g_rank, e.what());
    }
    return r == ncclInvalidArgument ? 0 : 1;
  } else if (mode == "abort") {     // rank 1 never joins; a watchdog thread aborts rank 0's communicators
    if (g_rank == 0) {
      std::thread watchdog([] {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        mc::abort_nccl_communicators();
      });
      const auto t0 = std::chrono::steady_clock::now();
      try {
        w.all_reduce(a, mc::ReduceOp::sum);
        std::printf("rank 0: all_reduce returned without its peers\n");
        watchdog.join();
        MPI_Abort(MPI_COMM_WORLD, 1);
      } catch (const std::exception& e) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("rank 0: aborted after %.1f s: %s\n", s, e.what());
        std::fflush(stdout);
        watchdog.join();
        MPI_Abort(MPI_COMM_WORLD, 0);   // rank 1 sleeps: end the job here
      }
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
  } else {
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  }
  be->synchronize();
  std::printf("rank %d: mode %s finished without a refusal\n", g_rank, mode.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const std::string mode = argc > 1 ? argv[1] : "ops";
  int rc = 0;
  try {
    rc = mode == "ops" ? run_ops() : run_rule(mode);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, e.what());
    rc = 1;
  }
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
