// MPI backend. Reductions do not use MPI_Allreduce (whose summation order depends on the algorithm
// Open MPI picks for the message size): reduce_scatter is an all-to-all of blocks followed by an
// ordered sum (reduce_blocks), all_reduce is that plus an all-gather. Same traffic as a ring.
#include "meshrun/comm/mpi.hpp"

#include "meshrun/comm/wait_state.hpp"

#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshrun::comm {

namespace {
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16: return MPI_UINT16_T;  // moved as bits; reduce_blocks sums them in float
  }
  return MPI_BYTE;
}
int count_of(std::int64_t n) {
  if (n < 0 || n > INT_MAX) throw std::runtime_error("MpiComm: message of " + std::to_string(n) + " elements exceeds MPI's int count");
  return static_cast<int>(n);
}
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI call failed: ") + what);
}
}  // namespace

MpiComm::MpiComm(MPI_Comm comm, bool owned, const char* label, std::vector<int> world_ranks)
    : comm_(comm), owned_(owned), label_(label), world_ranks_(std::move(world_ranks)) {
  MPI_Comm_size(comm_, &size_);
  MPI_Comm_rank(comm_, &rank_);
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  if (flag && ub) tag_ub_ = *ub;
}
MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

// The blocking forms are the non-blocking ones, waited on: one code path.
void MpiComm::reduce_scatter(Buf send, Buf recv, ReduceOp op) { ireduce_scatter(send, recv, op).wait(); }

void MpiComm::all_gather(Buf send, Buf recv) { iall_gather(send, recv).wait(); }

void MpiComm::all_reduce(Buf b, ReduceOp op) {
  void* buf = b.p;
  const std::int64_t n = b.n;
  const DType t = b.t;
  if (size_ == 1 || n == 0) return;
  // Pad to a multiple of the group size, reduce-scatter, gather back.
  const std::int64_t chunk = (n + size_ - 1) / size_;
  const std::size_t es = dtype_size(t);
  std::vector<char> padded(static_cast<std::size_t>(chunk) * size_ * es, 0);
  std::memcpy(padded.data(), buf, static_cast<std::size_t>(n) * es);
  char* own = padded.data() + static_cast<std::size_t>(rank_) * chunk * es;
  reduce_scatter(Buf{padded.data(), chunk * size_, t}, Buf{own, chunk, t}, op);
  all_gather(Buf{own, chunk, t}, Buf{padded.data(), chunk * size_, t});
  std::memcpy(buf, padded.data(), static_cast<std::size_t>(n) * es);
}

void MpiComm::broadcast(Buf b, int root) {
  if (size_ == 1) return;
  const WaitScope waiting("broadcast", label_, -1);
  check(MPI_Bcast(b.p, count_of(b.n), mpi_type(b.t), root, comm_), "MPI_Bcast");
}
namespace {
struct MpiPending : Request::Pending {
  MPI_Request req = MPI_REQUEST_NULL;
  const char* op = "?";     // what a wait on it reports (wait_state.hpp)
  const char* group = "?";
  int peer = -1;            // world rank, point-to-point only
  MpiPending(const char* o, const char* g, int p) : op(o), group(g), peer(p) {}
  void wait() override {
    const WaitScope waiting(op, group, peer);
    check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
  }
  bool test() override {
    int done = 0;
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    return done != 0;
  }
};
// The non-blocking reduce_scatter: the all-to-all of blocks in flight, the ordered sum when it is done.
struct MpiReduceScatter final : MpiPending {
  using MpiPending::MpiPending;
  std::vector<char> blocks;
  void* recv = nullptr;
  std::int64_t n = 0;
  int count = 0;
  DType t = DType::f32;
  ReduceOp op = ReduceOp::sum;
  bool reduced = false;
  void wait() override {
    MpiPending::wait();
    if (!reduced) reduce_blocks(recv, blocks.data(), count, n, t, op);
    reduced = true;
  }
};
void check_tag(int tag, int ub) {
  if (tag < 0 || tag > ub)
    throw std::runtime_error("MpiComm: message tag " + std::to_string(tag) + " outside MPI's range [0, " +
                             std::to_string(ub) + "]; use fewer micro-batches per step");
}
}  // namespace

Request MpiComm::ireduce_scatter(Buf sb, Buf rb, ReduceOp op) {
  const void* send = sb.p;
  void* recv = rb.p;
  const std::int64_t n = rb.n;
  const DType t = rb.t;
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, static_cast<std::size_t>(n) * dtype_size(t));
    return Request();
  }
  auto rs = std::make_unique<MpiReduceScatter>("reduce_scatter", label_, -1);
  rs->blocks.resize(static_cast<std::size_t>(n) * size_ * dtype_size(t));
  rs->recv = recv;
  rs->n = n;
  rs->count = size_;
  rs->t = t;
  rs->op = op;
  check(MPI_Ialltoall(send, count_of(n), mpi_type(t), rs->blocks.data(), count_of(n), mpi_type(t), comm_, &rs->req),
        "MPI_Ialltoall (ireduce_scatter)");
  return Request(std::move(rs));
}

Request MpiComm::iall_gather(Buf sb, Buf rb) {
  const void* send = sb.p;
  void* recv = rb.p;
  const std::int64_t n = sb.n;
  const DType t = sb.t;
  if (size_ == 1) {
    if (send != recv) std::memmove(recv, send, static_cast<std::size_t>(n) * dtype_size(t));
    return Request();
  }
  const char* own = static_cast<const char*>(recv) + static_cast<std::size_t>(rank_) * n * dtype_size(t);
  const void* src = (send == own) ? MPI_IN_PLACE : send;
  auto op = std::make_unique<MpiPending>("all_gather", label_, -1);
  check(MPI_Iallgather(src, count_of(n), mpi_type(t), recv, count_of(n), mpi_type(t), comm_, &op->req),
        "MPI_Iallgather");
  return Request(std::move(op));
}

Request MpiComm::isend(Buf b, int peer, int tag) {
  check_tag(tag, tag_ub_);
  auto op = std::make_unique<MpiPending>("send", label_, world_rank(peer));
  check(MPI_Isend(b.p, count_of(b.n), mpi_type(b.t), peer, tag, comm_, &op->req), "MPI_Isend");
  return Request(std::move(op));
}
Request MpiComm::irecv(Buf b, int peer, int tag) {
  check_tag(tag, tag_ub_);
  auto op = std::make_unique<MpiPending>("recv", label_, world_rank(peer));
  check(MPI_Irecv(b.p, count_of(b.n), mpi_type(b.t), peer, tag, comm_, &op->req), "MPI_Irecv");
  return Request(std::move(op));
}
void MpiComm::all_to_all(Buf sb, const std::int64_t* send_counts, Buf rb, const std::int64_t* recv_counts) {
  const void* send = sb.p;
  void* recv = rb.p;
  const DType t = sb.t;
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  std::int64_t so = 0, ro = 0;
  for (int r = 0; r < size_; ++r) {
    sc[r] = count_of(send_counts[r]);
    rc[r] = count_of(recv_counts[r]);
    sd[r] = count_of(so);
    rd[r] = count_of(ro);
    so += send_counts[r];
    ro += recv_counts[r];
  }
  const WaitScope waiting("all_to_all", label_, -1);
  check(MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(), mpi_type(t), comm_),
        "MPI_Alltoallv");
}
void MpiComm::barrier() {
  const WaitScope waiting("barrier", label_, -1);
  check(MPI_Barrier(comm_), "MPI_Barrier");
}

Groups make_mpi_groups(MPI_Comm base, const RankGrid& grid) {
  int rank = 0, size = 0;
  MPI_Comm_rank(base, &rank);
  MPI_Comm_size(base, &size);
  if (size != grid.world())
    throw std::runtime_error("make_mpi_groups: communicator has " + std::to_string(size) + " ranks, layout needs " +
                             std::to_string(grid.world()));
  Groups g;
  for (GroupKind k : kGroupKinds) {
    const std::vector<int> members = grid.group_of(rank, k);
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(base, members.front(), grid.index_in_group(rank, k), &sub), "MPI_Comm_split");
    g.by_kind[static_cast<int>(k)] = std::make_unique<MpiComm>(sub, true, group_name(k), members);
  }
  MPI_Comm dup = MPI_COMM_NULL;
  check(MPI_Comm_dup(base, &dup), "MPI_Comm_dup");
  g.world = std::make_unique<MpiComm>(dup, true);
  return g;
}

}  // namespace meshrun::comm
