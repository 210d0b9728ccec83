// The MPI backend of Comm and the per-group communicators, under `mpirun -np 4`: groups match the mesh
// rank map, reductions are fixed-order and identical on every rank, and every collective the interface
// offers moves the right elements.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "meshrun/train/comm_names.hpp"
#include "meshrun/comm/mpi.hpp"

using meshrun::comm::make_mpi_groups;
using meshrun::comm::MpiComm;

using namespace meshrun;
using namespace meshrun::train;

namespace {
int failures = 0, checks = 0, world_rank = 0;
void check(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL rank %d: %s\n", world_rank, what.c_str());
  }
}

// Values whose float sum depends on the order: in rank order (1 + 1) + 1e8 − 1e8 = 0, in reverse 2.
float value(int rank, int i) {
  const float v[4] = {1.0f + float(i % 2), 1.0f, 1e8f, -1e8f};
  return v[rank % 4];
}

void test_groups(const Layout& layout, MPI_Comm world) {
  const RankGrid grid(layout);
  const Groups g = make_mpi_groups(world, grid);
  for (GroupKind k : kGroupKinds) {
    Comm& c = g[k];
    const std::vector<int> members = grid.group_of(world_rank, k);
    check(c.size() == int(members.size()), std::string(group_name(k)) + " size");
    check(c.rank() == grid.index_in_group(world_rank, k), std::string(group_name(k)) + " index");
    std::vector<std::int32_t> got(c.size());
    const std::int32_t me = world_rank;
    c.all_gather(&me, got.data(), 1);
    check(std::vector<int>(got.begin(), got.end()) == members, std::string(group_name(k)) + " members " + layout.order.str());
  }
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  {
    // 1. Groups from the rank map, for two orders.
    Layout l;
    l.tp = 2;
    l.dp = size / 2;
    test_groups(l, MPI_COMM_WORLD);
    std::string err;
    l.order = *parse_order("dp-tp-cp-ep-pp", &err);
    test_groups(l, MPI_COMM_WORLD);

    MpiComm c(MPI_COMM_WORLD, false);
    const int p = c.size(), r = c.rank();
    // 2. all_reduce = ordered sum of every rank's buffer, bit for bit, on every rank.
    const int n = 7;
    std::vector<float> mine(n), all(n * p), expect(n), buf(n);
    for (int i = 0; i < n; ++i) mine[i] = value(r, i);
    c.all_gather(mine.data(), all.data(), n);
    reduce_blocks(expect.data(), all.data(), p, n, DType::f32, ReduceOp::sum);
    buf = mine;
    c.all_reduce(buf.data(), n);
    check(std::memcmp(buf.data(), expect.data(), n * 4) == 0, "all_reduce is the ordered sum");
    float naive = 0;  // and the order really matters for these values
    for (int q = p - 1; q >= 0; --q) naive += all[q * n + 1];
    check(p < 4 || naive != expect[1], "test values are order-sensitive");
    // 3. reduce_scatter gives the same bits as all_reduce for each block (in place too).
    std::vector<float> blocks(n * p), out(n);
    for (int q = 0; q < p; ++q)
      for (int i = 0; i < n; ++i) blocks[q * n + i] = value(r, q * n + i);
    std::vector<float> full = blocks;
    c.all_reduce(full.data(), n * p);
    c.reduce_scatter(blocks.data(), out.data(), n);
    check(std::memcmp(out.data(), full.data() + r * n, n * 4) == 0, "reduce_scatter == block of all_reduce");
    c.reduce_scatter(blocks.data(), blocks.data() + r * n, n);
    check(std::memcmp(blocks.data() + r * n, full.data() + r * n, n * 4) == 0, "reduce_scatter in place");
    // 3b. The non-blocking forms give the same bits (against the same blocks, which 3. overwrote in
    //     place); recv is written only at completion; two can be in flight on one communicator at once.
    {
      std::vector<float> src(n * p), nb(n, -7.f), gathered(n * p, -7.f);
      for (int q = 0; q < p; ++q)
        for (int i = 0; i < n; ++i) src[q * n + i] = value(r, q * n + i);
      Request a = c.ireduce_scatter(src.data(), nb.data(), n);
      Request g = c.iall_gather(out.data(), gathered.data(), n);
      check(p == 1 || nb[0] == -7.f, "ireduce_scatter leaves recv alone until it completes");
      while (!a.test()) {
      }
      check(!a.pending(), "test() completes the request");
      g.wait();
      check(std::memcmp(nb.data(), full.data() + r * n, n * 4) == 0, "ireduce_scatter == reduce_scatter");
      check(std::memcmp(gathered.data(), full.data(), std::size_t(n) * p * 4) == 0,
            "iall_gather of the reduced blocks == all_reduce");
    }
    // 4. max, in double.
    double m = r * 1.5;
    c.all_reduce(&m, 1, ReduceOp::max);
    check(m == (p - 1) * 1.5, "all_reduce max");
    // 5. broadcast from rank 1.
    std::int64_t b[2] = {r == 1 ? 42 : -1, r == 1 ? -7 : -1};
    c.broadcast(host_buf(b, 2), 1 % p);
    check(b[0] == (p > 1 ? 42 : -1) && b[1] == (p > 1 ? -7 : -1), "broadcast");
    // 6. send/recv around a ring (even ranks send first).
    if (p > 1) {
      std::int32_t to = r * 10, from = -1;
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      if (r % 2 == 0) {
        c.send(host_buf(&to, 1), next, 3);
        c.recv(host_buf(&from, 1), prev, 3);
      } else {
        c.recv(host_buf(&from, 1), prev, 3);
        c.send(host_buf(&to, 1), next, 3);
      }
      check(from == prev * 10, "send/recv ring");
    }
    // 6b. Non-blocking exchange in both directions at once, 4 MiB each way (far above Open MPI's eager
    //     limit): every rank posts both sends before any receive, as a pipeline's steady state and a
    //     ring do. Blocking sends in this order would deadlock.
    if (p > 1) {
      const std::int64_t big = std::int64_t(1) << 20;
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      std::vector<float> to_next(big, float(r)), to_prev(big, float(-r)), from_prev(big, -1.f), from_next(big, -1.f);
      Request s1 = c.isend(host_buf(to_next.data(), big), next, 5);
      Request s2 = c.isend(host_buf(to_prev.data(), big), prev, 6);
      Request r1 = c.irecv(host_buf(from_prev.data(), big), prev, 5);
      Request r2 = c.irecv(host_buf(from_next.data(), big), next, 6);
      check(s1.pending() && r2.pending(), "non-blocking requests pending until waited");
      r2.wait();
      r1.wait();
      s2.wait();
      s1.wait();
      check(!s1.pending() && from_prev[0] == float(prev) && from_prev[big - 1] == float(prev) &&
                from_next[big - 1] == float(-next),
            "isend/irecv both directions, 4 MiB");
      std::vector<double> ring_out(big / 2, double(r)), ring_in(big / 2, -1.0);
      c.sendrecv(host_buf(ring_out.data(), big / 2), next, host_buf(ring_in.data(), big / 2), prev, 7);
      check(ring_in[0] == double(prev) && ring_in[big / 2 - 1] == double(prev), "sendrecv around the ring");
      check(c.max_tag() >= 32767, "MPI_TAG_UB at least the standard's 32767");
    }
    // 7. all_to_all with counts: rank r sends r+q+1 values to rank q, each encoding (r, q, i).
    std::vector<std::int64_t> sc(p), rc(p);
    std::vector<float> sbuf, rbuf;
    for (int q = 0; q < p; ++q) {
      sc[q] = r + q + 1;
      rc[q] = q + r + 1;
      for (int i = 0; i < sc[q]; ++i) sbuf.push_back(float(r * 100 + q * 10 + i));
    }
    rbuf.resize(std::accumulate(rc.begin(), rc.end(), std::size_t(0)));
    c.all_to_all(host_buf(sbuf.data(), std::int64_t(sbuf.size())), sc.data(), host_buf(rbuf.data(), std::int64_t(rbuf.size())), rc.data());
    bool ok = true;
    std::size_t o = 0;
    for (int q = 0; q < p; ++q)
      for (int i = 0; i < rc[q]; ++i) ok = ok && rbuf[o++] == float(q * 100 + r * 10 + i);
    check(ok, "all_to_all with counts");
    c.barrier();
  }
  int total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0) std::printf("%d checks per rank on %d ranks, %d failures\n", checks, size, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
