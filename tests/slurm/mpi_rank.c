/* Prints each MPI rank next to the plugin's RANK, and checks an allreduce, for the `srun --mpi=pmix` test. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  long mine = rank, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const char* plugin_rank = getenv("RANK");
  const char* plugin_world = getenv("WORLD_SIZE");
  printf("MPIRANK mpi_rank=%d mpi_size=%d RANK=%s WORLD_SIZE=%s sum=%ld expected=%ld\n", rank, size,
         plugin_rank ? plugin_rank : "unset", plugin_world ? plugin_world : "unset", sum,
         (long)size * (size - 1) / 2);
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
