/* allocate_TM/free_TM pairs against malloc/free through the C ABI, the way an
 * application calls them (attune bench's alloc-small calls the runtime from Rust).
 * Three rounds, each timing N pairs of SIZE bytes with the first byte written.
 * Usage: alloc_pair [N=5000000] [SIZE=64]   (docs/benchmarks.md has the build line) */
#include <attune.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 5000000;
    size_t sz = argc > 2 ? (size_t)atol(argv[2]) : 64;
    if (n <= 0 || sz == 0) {
        fprintf(stderr, "usage: alloc_pair [N>0] [SIZE>0]\n");
        return 2;
    }
    /* Warm-up: the class's arena is created by its first request. */
    for (long i = 0; i < n / 100; i++) { volatile char *p = allocate_TM(sz, 0); p[0] = 1; free_TM((void *)p); }
    for (int r = 0; r < 3; r++) {
        double t = now();
        for (long i = 0; i < n; i++) {
            volatile char *p = allocate_TM(sz, 0);
            if (!p) { fprintf(stderr, "allocate_TM: %s\n", attune_last_error()); return 1; }
            p[0] = 1;
            free_TM((void *)p);
        }
        double a = (now() - t) / n * 1e9;
        t = now();
        for (long i = 0; i < n; i++) { volatile char *p = malloc(sz); p[0] = 1; free((void *)p); }
        double m = (now() - t) / n * 1e9;
        printf("size %zu: allocate_TM/free_TM %.1f ns, malloc/free %.1f ns, ratio %.2f\n", sz, a, m, a / m);
    }
    return 0;
}
