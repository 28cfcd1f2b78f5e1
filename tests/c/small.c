/* Small allocations share class arenas: 100,000 blocks of 16 B to 64 KiB cost no region
 * each, keep their data, and are freed individually. */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include "check.h"

int main(void) {
    enum { N = 100000 };
    static unsigned char *p[N]; static size_t sz[N];
    int classes[] = {0, ATTUNE_LAT, ATTUNE_BW, ATTUNE_CAP, ATTUNE_SHL, ATTUNE_LAT | ATTUNE_CAP};
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sz[i] = 16 + x % (i % 100 == 0 ? 65536 : 256);
        p[i] = allocate_TM(sz[i], classes[i % 6]);
        CHECK(p[i] != NULL, "alloc %d", i);
        if (!p[i]) CHECK_DONE();
        CHECK(((uintptr_t)p[i] & 15) == 0, "16-byte alignment");
        memset(p[i], (unsigned char)i, sz[i]);
    }
    int bad = 0;
    for (int i = 0; i < N; i += 2) { for (size_t k = 0; k < sz[i]; k++) bad += p[i][k] != (unsigned char)i; free_TM(p[i]); }
    for (int i = 1; i < N; i += 2) for (size_t k = 0; k < sz[i]; k++) bad += p[i][k] != (unsigned char)i;
    CHECK(bad == 0, "%d bytes corrupted", bad);
    attune_region_stats_t s;
    CHECK(attune_region_stats(p[1], &s) == 0, "stats of a small block: %s", attune_last_error());
    CHECK(s.size >= sz[1] && s.size < sz[1] + 1024, "stats report the block size (usable): %llu for %zu", (unsigned long long)s.size, sz[1]);
    /* The arenas take no far-tier room from regions: with six classes live (six arenas of
     * `small_arena` virtual bytes each), a 48 MiB region still gets its tier space even
     * when the only far tier is a 1 GiB file (scripts/test.sh runs this on it too). */
    enum { BIG = 48 << 20 };
    unsigned char *big = allocate_TM(BIG, 0);
    CHECK(big != NULL, "a 48 MiB region beside the small arenas: %s", attune_last_error());
    if (big) {
        for (size_t k = 0; k < BIG; k += 4096) big[k] = (unsigned char)(k >> 12);
        int badbig = 0;
        for (size_t k = 0; k < BIG; k += 4096) badbig += big[k] != (unsigned char)(k >> 12);
        CHECK(badbig == 0, "%d pages of the 48 MiB region corrupted", badbig);
        free_TM(big);
    }
    for (int i = 1; i < N; i += 2) CHECK(attune_free(p[i]) == 0, "free %d", i);
    CHECK_DONE();
}
