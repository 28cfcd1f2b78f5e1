/* Without userfaultfd (ATTUNE_DISABLE_UFFD=1, as when a seccomp profile denies it):
 * allocations still work on plain DRAM, tier operations say ENOTSUP, bad pointers EINVAL. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include "check.h"

int main(void) {
    size_t n = 32u << 20, words = n / 8;
    uint64_t *a = allocate_TM(n, ATTUNE_LAT);
    CHECK(a != NULL, "alloc in plain mode: %s", attune_last_error());
    if (!a) CHECK_DONE();
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "%lu bad words", bad);
    errno = 0; CHECK(attune_pin(a, 4096) == -1 && errno == ENOTSUP, "pin without tiers: errno %d", errno);
    attune_region_stats_t s;
    errno = 0; CHECK(attune_region_stats(a, &s) == -1 && errno == ENOTSUP, "stats without tiers: errno %d", errno);
    CHECK(attune_tier_count() == 1, "only the DRAM tier");
    int x;
    errno = 0; CHECK(attune_free(&x) == -1 && errno == EINVAL, "foreign pointer");
    CHECK(attune_free(a) == 0, "free");
    errno = 0; CHECK(attune_free(a) == -1 && errno == EINVAL, "double free");
    CHECK_DONE();
}
