/* Dense matrix multiply C = A*B (blocked, row-major doubles, three n x n matrices from
 * MiB), entries of A and B small integers so C is exact; sampled entries are recomputed
 * as dot products. Compute-bound with streaming reuse (BW). Usage: dgemm MiB */
#include "common.h"

int main(int argc, char **argv) {
  size_t n = 64;
  while ((n + 64) * (n + 64) * 8 * 3 <= (arg_mib(argc, argv, 96) << 20)) n += 64;
  double *a = xmalloc(n * n * 8), *b = xmalloc(n * n * 8), *c = calloc(n * n, 8);
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) { a[i * n + j] = (double)((i * j) % 7); b[i * n + j] = (double)((i + j) % 5); }
  const size_t bs = 64;
  double t0 = now_s();
  for (size_t ii = 0; ii < n; ii += bs)
    for (size_t kk = 0; kk < n; kk += bs)
      for (size_t jj = 0; jj < n; jj += bs)
        for (size_t i = ii; i < ii + bs; i++)
          for (size_t k = kk; k < kk + bs; k++) {
            double aik = a[i * n + k];
            for (size_t j = jj; j < jj + bs; j++) c[i * n + j] += aik * b[k * n + j];
          }
  double secs = now_s() - t0;
  int ok = 1;
  uint64_t x = 3;
  for (int s = 0; s < 64 && ok; s++) {
    x = mix64(x + s);
    size_t i = x % n, j = (x >> 32) % n;
    double d = 0;
    for (size_t k = 0; k < n; k++) d += a[i * n + k] * b[k * n + j];
    if (d != c[i * n + j]) ok = 0;
  }
  RESULT("dgemm", ok, secs, "n=%zu GFLOPS=%.2f", n, 2.0 * n * n * n / secs / 1e9);
  return !ok;
}
