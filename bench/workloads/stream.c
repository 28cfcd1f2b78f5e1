/* STREAM-like triad a = b + s*c over three arrays of MiB/3 each, 10 passes, verified
 * against the closed form. Bandwidth-bound (BW). Usage: stream MiB */
#include "common.h"

int main(int argc, char **argv) {
  size_t n = (arg_mib(argc, argv, 256) << 20) / 8 / 3;
  double *a = xmalloc(n * 8), *b = xmalloc(n * 8), *c = xmalloc(n * 8);
  for (size_t i = 0; i < n; i++) { a[i] = 0; b[i] = (double)(i & 1023); c[i] = 1.0; }
  double t = now_s();
  for (int pass = 0; pass < 10; pass++)
    for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0 * c[i] + pass;
  double secs = now_s() - t;
  int ok = 1;
  for (size_t i = 0; i < n; i += 997) if (a[i] != (double)(i & 1023) + 3.0 + 9) { ok = 0; break; }
  RESULT("stream", ok, secs, "GBps=%.2f", 10.0 * 3 * n * 8 / secs / 1e9);
  return !ok;
}
