/* Random 8-byte updates over a malloc'ed array (an unmodified program for `attune run`):
 * fills MiB of words, adds 1 at N random places, and checks that the words gained exactly
 * N in total. Usage: rand_update MIB N [mmap] (mmap: an anonymous mapping instead of
 * malloc, which `attune run` gives the handler thread: docs/design/run.md). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 96;
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    size_t words = (mib << 20) / sizeof(uint64_t);
    int mapped = argc > 3 && !strcmp(argv[3], "mmap");
    uint64_t *a = mapped ? mmap(NULL, words * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                         : malloc(words * sizeof(uint64_t));
    if (a == MAP_FAILED) a = NULL;
    if (!a || n < 0) { fprintf(stderr, "rand_update: cannot allocate %zu MiB\n", mib); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    uint64_t x = 88172645463325252ull;
    for (long k = 0; k < n; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        a[x % words] += 1;
    }
    uint64_t gained = 0;
    for (size_t i = 0; i < words; i++) gained += a[i] - i * 0x9E3779B97F4A7C15ull;
    if (gained != (uint64_t)n) { printf("rand_update: FAIL, %llu updates found of %ld\n", (unsigned long long)gained, n); return 1; }
    printf("rand_update: OK (%ld updates over %zu MiB)\n", n, mib);
    if (mapped) munmap(a, words * sizeof(uint64_t)); else free(a);
    return 0;
}
