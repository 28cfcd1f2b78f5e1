/* GUPS-like random 8-byte updates (HPCC RandomAccess): table of MiB, one update per 4 words
 * in total; verified by applying the same updates again, which restores the table.
 * Latency-bound (LAT). Usage: gups MiB */
#include "common.h"

int main(int argc, char **argv) {
  size_t n = (arg_mib(argc, argv, 256) << 20) / 8, updates = n / 4;
  uint64_t *t = xmalloc(n * 8);
  for (size_t i = 0; i < n; i++) t[i] = i;
  double t0 = now_s();
  uint64_t x = 1;
  for (size_t k = 0; k < updates; k++) { x = mix64(x + k); t[x % n] ^= x; }
  double secs = now_s() - t0;
  x = 1;
  for (size_t k = 0; k < updates; k++) { x = mix64(x + k); t[x % n] ^= x; }
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += t[i] != i;
  RESULT("gups", bad == 0, secs, "MUPS=%.3f errors=%zu", updates / secs / 1e6, bad);
  return bad != 0;
}
