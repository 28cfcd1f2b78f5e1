/* attune run test: two MPI ranks each fill a buffer larger than the budget, exchange
 * them (MPI reads and writes managed memory through its own transports), and verify
 * what they received. Usage: mpirun -np 2 attune run -- mpi_exchange MiB */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 64, n = (mib << 20) / 8 / 2;
  uint64_t *mine = malloc(n * 8), *theirs = malloc(n * 8);
  for (size_t i = 0; i < n; i++) mine[i] = mix(i + (uint64_t)rank * n);
  int peer = (rank + 1) % size, bad = 0;
  size_t step = 1 << 20; /* in 8 MiB messages */
  for (size_t off = 0; off < n; off += step) {
    size_t cnt = n - off < step ? n - off : step;
    MPI_Sendrecv(mine + off, (int)cnt, MPI_UINT64_T, peer, 0, theirs + off, (int)cnt, MPI_UINT64_T, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  for (size_t i = 0; i < n; i++) if (theirs[i] != mix(i + (uint64_t)peer * n)) { bad = 1; break; }
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("mpi_exchange: %s ranks=%d\n", any ? "BAD" : "OK", size);
  free(mine); free(theirs);
  MPI_Finalize();
  return any;
}
