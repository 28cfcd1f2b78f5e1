/* attune run test: OpenMP triad and reduction over malloc'ed arrays larger than the
 * budget; the result is checked against its closed form. Usage: omp_stream MiB */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 96, n = (mib << 20) / 8 / 3;
  double *a = malloc(n * 8), *b = malloc(n * 8), *c = malloc(n * 8);
  if (!a || !b || !c) return 2;
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) { b[i] = (double)(i % 1000); c[i] = 2.0; }
#pragma omp parallel for
  for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i];
  double s = 0;
#pragma omp parallel for reduction(+ : s)
  for (size_t i = 0; i < n; i++) s += a[i];
  double want = 0;
  for (size_t i = 0; i < n; i++) want += (double)(i % 1000) + 6.0;
  int ok = s == want;
  printf("omp_stream: %s threads=%d sum=%.0f\n", ok ? "OK" : "BAD", omp_get_max_threads(), s);
  free(a); free(b); free(c);
  return ok ? 0 : 1;
}
