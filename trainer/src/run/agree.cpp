#include "agree.hpp"

#include <mpi.h>

namespace meshrun::train::cli {

bool all_ok(bool ok) {
  int v = ok ? 1 : 0, r = 0;
  MPI_Allreduce(&v, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return r == 1;
}

void collective_check(const std::string& why, int rank, int world) {
  int mine = why.empty() ? world : rank, first = world;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (first == world) return;
  int len = rank == first ? static_cast<int>(why.size()) : 0;
  MPI_Bcast(&len, 1, MPI_INT, first, MPI_COMM_WORLD);
  std::string msg = rank == first ? why : std::string(static_cast<size_t>(len), ' ');
  MPI_Bcast(msg.data(), len, MPI_CHAR, first, MPI_COMM_WORLD);
  throw InputError(msg);
}

}  // namespace meshrun::train::cli
