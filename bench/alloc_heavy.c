/* Allocation-heavy program for the `attune run` overhead benchmark (docs/benchmarks.md).
 * "small": 4M malloc/free of 16 B-1 KiB objects with a live set of 64K (glibc serves them;
 * the interposer only decides). "large": 300 buffers of 4 MiB, each written, summed and
 * freed (managed: every page first-touched through the runtime). Prints a checksum. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

int main(int argc, char **argv) {
  const char *what = argc > 1 ? argv[1] : "small";
  uint64_t sum = 0, s = 1;
  if (!strcmp(what, "small")) {
    enum { LIVE = 65536 };
    static char *live[LIVE];
    for (long k = 0; k < 4000000; k++) {
      s = mix(s);
      size_t i = s % LIVE, n = 16 + (s >> 32) % 1008;
      free(live[i]);
      live[i] = malloc(n);
      live[i][0] = (char)k; live[i][n - 1] = 1;
      sum += (unsigned char)live[i][0];
    }
    for (int i = 0; i < LIVE; i++) free(live[i]);
  } else {
    size_t n = 4 << 20;
    for (int k = 0; k < 300; k++) {
      uint64_t *b = malloc(n);
      for (size_t i = 0; i < n / 8; i++) b[i] = i + k;
      for (size_t i = 0; i < n / 8; i += 8) sum += b[i];
      free(b);
    }
  }
  printf("%s checksum %llu\n", what, (unsigned long long)sum);
  return 0;
}
