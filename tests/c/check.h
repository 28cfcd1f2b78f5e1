/* Minimal assertion helpers for the native tests: every CHECK counts, a failure prints
 * the expression and the line, and the process exits non-zero at the end. */
#ifndef ATTUNE_CHECK_H
#define ATTUNE_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/mman.h>
static int check_failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { check_failures++; \
    fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)
#define CHECK_DONE() do { if (check_failures) { fprintf(stderr, "%d check(s) failed\n", check_failures); return 1; } return 0; } while (0)

static inline uint64_t mix64(uint64_t x) { /* splitmix64: the expected content of word x */
    x += 0x9E3779B97F4A7C15ull; x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull; return x ^ (x >> 31);
}
/* Resident pages of a range, by mincore(2). */
static inline size_t resident_bytes(void *p, size_t len) {
    long ps = sysconf(_SC_PAGESIZE); size_t n = (len + ps - 1) / ps, r = 0;
    unsigned char *v = malloc(n); if (!v) return 0;
    if (mincore(p, len, v) == 0) for (size_t i = 0; i < n; i++) r += v[i] & 1;
    free(v); return r * ps;
}
static inline size_t env_size(const char *name, size_t dflt) {
    const char *v = getenv(name); return v ? strtoull(v, NULL, 0) : dflt;
}
#endif
