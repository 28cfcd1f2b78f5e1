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
    CHECK(s.size < 65536 + 16, "stats report the block size");
    for (int i = 1; i < N; i += 2) CHECK(attune_free(p[i]) == 0, "free %d", i);
    CHECK_DONE();
}
