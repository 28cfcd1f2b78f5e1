/* Many threads read and write random words of one region under a small budget; several
 * threads hit the same pages at the same time. Each word holds (index, version) written
 * by its owner thread; every read is checked. */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <stdatomic.h>
#include "check.h"

static uint64_t *a; static size_t words; static int nthreads = 8; static long iters = 60000;
static atomic_ulong errors;
static void *worker(void *arg) {
    long t = (long)arg; uint64_t x = 0x9E3779B97F4A7C15ull * (t + 1);
    for (long k = 0; k < iters; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t i = x % words;
        uint64_t v = __atomic_load_n(&a[i], __ATOMIC_RELAXED);
        if ((v >> 32) != (i & 0xffffffff)) atomic_fetch_add(&errors, 1);
        if ((size_t)(i % nthreads) == (size_t)t)   /* owner writes a new version */
            __atomic_store_n(&a[i], ((i & 0xffffffff) << 32) | ((v + 1) & 0xffffffff), __ATOMIC_RELAXED);
        if ((k & 1023) == 0) { /* everyone hammers the same page */
            size_t j = (k >> 10) * 512 % words;
            if ((__atomic_load_n(&a[j], __ATOMIC_RELAXED) >> 32) != (j & 0xffffffff)) atomic_fetch_add(&errors, 1);
        }
    }
    return NULL;
}
int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoull(argv[1], 0, 0) : 64) << 20; words = n / 8;
    nthreads = (int)env_size("STRESS_THREADS", 8);
    if (nthreads < 1 || nthreads > 64) nthreads = 8;
    iters = (long)env_size("STRESS_ITERS", 60000);   /* accesses per thread */
    a = allocate_TM(n, 0);
    CHECK(a != NULL, "alloc"); if (!a) CHECK_DONE();
    for (size_t i = 0; i < words; i++) a[i] = (i & 0xffffffff) << 32;
    pthread_t th[64];
    for (long t = 0; t < nthreads; t++) pthread_create(&th[t], 0, worker, (void *)t);
    for (long t = 0; t < nthreads; t++) pthread_join(th[t], 0);
    CHECK(errors == 0, "%lu corrupted reads", (unsigned long)errors);
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += (a[i] >> 32) != (i & 0xffffffff);
    CHECK(bad == 0, "%lu words corrupted at the end", bad);
    attune_region_stats_t s; attune_region_stats(a, &s);
    CHECK(s.evictions > 0, "the test must evict");
    printf("stress: %d threads, faults %lu, evictions %lu\n", nthreads, s.faults, s.evictions);
    free_TM(a);
    CHECK_DONE();
}
