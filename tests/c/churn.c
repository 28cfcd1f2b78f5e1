/* Regions come and go while others fault: THREADS threads each allocate a region (1-4
 * MiB, far beyond a small budget between them), fill it, read and rewrite it at random
 * (evictions and fetches all the time), verify every word and free it, ITERS times. Far
 * tier offsets of freed regions are reused by new ones at once, so a slot release that
 * reached a new owner's data (the memory tier's batched release of copied-out slots,
 * docs/design.md) or a stale slot read as content would show as wrong words. */
#include <attune.h>
#include <pthread.h>
#include <stdatomic.h>
#include "check.h"

static atomic_long wrong, failed_allocs, regions;
static int iters;

static void *churn(void *arg) {
    uint64_t seed = (uintptr_t)arg * 1000003u, r = seed | 1;
    for (int it = 0; it < iters; it++) {
        size_t n = ((mix64(seed + it) % 4) + 1) << 20, w = n / 8;
        uint64_t key = mix64(seed ^ ((uint64_t)it * 7919u));
        uint64_t *a = allocate_TM(n, 0);
        if (!a) { atomic_fetch_add(&failed_allocs, 1); continue; }
        for (size_t i = 0; i < w; i++) a[i] = mix64(i ^ key);
        for (size_t k = 0; k < w / 16; k++) {
            r ^= r << 13; r ^= r >> 7; r ^= r << 17;
            size_t i = r % w;
            if (a[i] != mix64(i ^ key)) atomic_fetch_add(&wrong, 1);
            if (k & 1) a[i] = mix64(i ^ key);
        }
        for (size_t i = 0; i < w; i++)
            if (a[i] != mix64(i ^ key)) atomic_fetch_add(&wrong, 1);
        free_TM(a);
        atomic_fetch_add(&regions, 1);
    }
    return NULL;
}

int main(void) {
    int threads = (int)env_size("THREADS", 8);
    iters = (int)env_size("ITERS", 6);
    if (threads > 64) threads = 64;
    pthread_t th[64];
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, churn, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    attune_tier_stats_t t;
    CHECK(attune_tier_stats(1, &t) == 0, "tier stats");
    printf("churn: %d threads, %ld regions, %ld wrong words, far loads %llu, stores %llu\n", threads,
           (long)regions, (long)wrong, (unsigned long long)t.faults, (unsigned long long)t.evictions);
    CHECK(failed_allocs == 0, "%ld allocations failed", (long)failed_allocs);
    CHECK(wrong == 0, "%ld wrong words", (long)wrong);
    CHECK(t.faults > 1000 && t.evictions > 1000, "the test must evict and fetch");
    CHECK_DONE();
}
