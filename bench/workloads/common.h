/* Shared by the workload kernels: sizes, a deterministic mixer, timing and the one-line
 * result every kernel prints: "RESULT <name> OK|BAD seconds=<s> <key>=<value>". */
#ifndef ATTUNE_WORKLOAD_COMMON_H
#define ATTUNE_WORKLOAD_COMMON_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; x ^= x >> 29; x *= 0xBF58476D1CE4E5B9ull; return x ^ (x >> 32);
}
static inline double now_s(void) {
  struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9;
}
static inline size_t arg_mib(int argc, char **argv, size_t dflt) {
  return argc > 1 ? strtoul(argv[1], 0, 10) : dflt;
}
static inline void *xmalloc(size_t n) {
  void *p = malloc(n);
  if (!p) { fprintf(stderr, "out of memory (%zu bytes)\n", n); exit(2); }
  return p;
}
#define RESULT(name, ok, secs, fmt, ...) \
  printf("RESULT %s %s seconds=%.4f " fmt "\n", name, (ok) ? "OK" : "BAD", secs, __VA_ARGS__)
#endif
