/* XSBench-like macroscopic cross-section lookups: per nuclide a sorted energy grid with
 * five cross sections per point; each lookup picks a random energy and material, binary
 * searches every nuclide of the material and interpolates. A sample of lookups is
 * recomputed by linear search to verify. Latency-bound (LAT). Usage: xsbench MiB */
#include "common.h"

#define NUC 64
typedef struct { double e, xs[5]; } point;

static double lookup(point *grid, size_t g, double e, int linear, double out[5]) {
  size_t lo = 0, hi = g - 1;
  if (linear) { while (lo + 1 < g && grid[lo + 1].e <= e) lo++; }
  else { while (hi - lo > 1) { size_t m = (lo + hi) / 2; if (grid[m].e <= e) lo = m; else hi = m; } }
  if (lo >= g - 1) lo = g - 2;
  double f = (e - grid[lo].e) / (grid[lo + 1].e - grid[lo].e), s = 0;
  for (int k = 0; k < 5; k++) { out[k] = grid[lo].xs[k] + f * (grid[lo + 1].xs[k] - grid[lo].xs[k]); s += out[k]; }
  return s;
}

int main(int argc, char **argv) {
  size_t g = (arg_mib(argc, argv, 256) << 20) / sizeof(point) / NUC;
  point *grids = xmalloc(sizeof(point) * g * NUC);
  for (int n = 0; n < NUC; n++)
    for (size_t i = 0; i < g; i++) {
      point *p = &grids[n * g + i];
      p->e = (double)i / g + (double)(mix64(n * g + i) % 1000) * 1e-9 / g;
      for (int k = 0; k < 5; k++) p->xs[k] = (double)(mix64(n * g + i + k) % 10000) / 100.0;
    }
  size_t lookups = 20000;
  double t0 = now_s(), sum = 0, out[5];
  uint64_t x = 7;
  for (size_t l = 0; l < lookups; l++) {
    x = mix64(x + l);
    double e = (double)(x % 1000000) / 1e6;
    int mat = x >> 60, nn = 4 + mat * 3;
    for (int j = 0; j < nn; j++) sum += lookup(&grids[((x >> (j % 32)) % NUC) * g], g, e, 0, out);
  }
  double secs = now_s() - t0;
  int ok = 1;
  x = 99;
  for (int s = 0; s < 20 && ok; s++) {
    x = mix64(x + s);
    double e = (double)(x % 1000000) / 1e6, a[5], b[5];
    point *grid = &grids[(x % NUC) * g];
    if (lookup(grid, g, e, 0, a) != lookup(grid, g, e, 1, b)) ok = 0;
  }
  RESULT("xsbench", ok, secs, "lookups_per_s=%.0f checksum=%.6e", lookups / secs, sum);
  return !ok;
}
