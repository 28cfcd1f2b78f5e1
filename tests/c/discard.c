/* attune_discard: a range of an allocation reads as zero afterwards, whether its chunks
 * were resident or in a far tier (where the kernel's MADV_DONTNEED cannot reach them: the
 * test shows that too), and its far-tier space is freed. Data outside the range is kept.
 * Run under the default chunk size and a larger one (partial chunks at the edges). */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <sys/mman.h>
#include "check.h"

static uint64_t far_bytes(const attune_region_stats_t *s) {
    uint64_t b = 0;
    for (uint32_t t = 1; t < s->ntiers; t++) b += s->tier_bytes[t];
    return b;
}

int main(void) {
    size_t budget = env_size("TEST_BUDGET", 16u << 20), n = 4 * budget, words = n / 8;
    size_t ps = 4096;
    uint64_t *a = allocate_TM(n, 0);
    CHECK(a != NULL, "alloc: %s", attune_last_error());
    if (!a) CHECK_DONE();
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    attune_region_stats_t before, after;
    attune_region_stats(a, &before);
    CHECK(far_bytes(&before) > 0, "the start of the region must be in a far tier");

    /* The kernel's advice on a range whose chunks are far: their content comes back. That
     * is why attune_discard exists (documented in docs/design.md). */
    size_t k0 = 5 * ps / 8;            /* a page near the start: evicted first */
    if (resident_bytes(&a[k0], ps) == 0) {
        madvise(&a[k0], ps, MADV_DONTNEED);
        CHECK(a[k0] == mix64(k0), "a far page read after MADV_DONTNEED keeps its content");
    }

    /* Discard the first half plus 3 pages, starting 3 pages in (unaligned to 64 KiB
     * chunks at both ends): far chunks, resident ones, partial chunks. */
    size_t lo = 3 * ps, hi = n / 2 + 3 * ps;
    CHECK(attune_discard((char *)a + lo, hi - lo) == 0, "discard: %s", attune_last_error());
    attune_region_stats(a, &after);
    CHECK(far_bytes(&after) < far_bytes(&before),
          "far-tier space is freed: %llu -> %llu bytes", (unsigned long long)far_bytes(&before),
          (unsigned long long)far_bytes(&after));
    uint64_t bad_zero = 0, bad_kept = 0;
    for (size_t i = 0; i < words; i++) {
        size_t byte = i * 8;
        if (byte >= lo && byte < hi) bad_zero += a[i] != 0;
        else bad_kept += a[i] != mix64(i);
    }
    CHECK(bad_zero == 0, "%llu discarded words are not zero", (unsigned long long)bad_zero);
    CHECK(bad_kept == 0, "%llu words outside the range changed", (unsigned long long)bad_kept);
    /* The range is usable again, and its new content survives eviction. */
    for (size_t i = lo / 8; i < hi / 8; i++) a[i] = ~mix64(i);
    for (size_t i = hi / 8; i < words; i++) bad_kept += a[i] != mix64(i);   /* evicts the range */
    uint64_t bad_new = 0;
    for (size_t i = lo / 8; i < hi / 8; i++) bad_new += a[i] != ~mix64(i);
    CHECK(bad_new == 0, "%llu rewritten words wrong after eviction", (unsigned long long)bad_new);

    /* Bad input: nothing changes. */
    errno = 0;
    CHECK(attune_discard((char *)a + 1, ps) == -1 && errno == EINVAL, "unaligned start: EINVAL");
    CHECK(attune_discard(a, ps + 1) == -1 && errno == EINVAL, "unaligned length: EINVAL");
    CHECK(attune_discard((char *)a + n - ps, 2 * ps) == -1 && errno == EINVAL, "range leaving the allocation: EINVAL");
    static char foreign[8192] __attribute__((aligned(4096)));
    CHECK(attune_discard(foreign, ps) == -1 && errno == EINVAL, "foreign memory: EINVAL");
    void *small = allocate_TM(64, 0);
    CHECK(attune_discard((void *)((uintptr_t)small & ~(uintptr_t)(ps - 1)), ps) == -1 && errno == EINVAL,
          "small-block arena: EINVAL");
    free_TM(small);
    CHECK(a[words - 1] == mix64(words - 1), "data kept after the refused calls");
    printf("discard: far %llu -> %llu bytes\n", (unsigned long long)far_bytes(&before),
           (unsigned long long)far_bytes(&after));
    free_TM(a);
    CHECK_DONE();
}
