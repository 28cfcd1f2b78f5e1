/* Offsets of a freed region given to a later one (issue 25, docs/design/remote.md
 * "Requests in posting order"). argv[1] = MiB of each region (default 16), argv[2] = rounds
 * (default 40), argv[3] = ms to pause after each free (default 0); ATTUNE_DRAM small. Each
 * round allocates a region, fills it with the round's words (its first pages are stored
 * to the far tier as the fill goes on), and frees it: the tier discards the freed
 * region's offsets without waiting, and the evictor returns them to the free list on its
 * next pass. Without a pause the next region is allocated before that and takes other
 * offsets (the round after next gets these); with a pause longer than the evictor's tick
 * it takes the freed ones, and its stores follow that discard. Every
 * word of each region must read back as written: a discard applied after a store that
 * followed it would drop the store's pages while the tier takes them for held. */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include <unistd.h>
#include "check.h"

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 16;
    int rounds = argc > 2 ? atoi(argv[2]) : 40;
    int pause_ms = argc > 3 ? atoi(argv[3]) : 0;
    size_t n = mib << 20, words = n / 8;
    uint64_t bad = 0;
    for (int r = 0; r < rounds; r++) {
        uint64_t *a = allocate_TM(n, ATTUNE_CAP);
        CHECK(a != NULL, "allocate_TM: %s", attune_last_error());
        if (!a) CHECK_DONE();
        for (size_t i = 0; i < words; i++) a[i] = mix64(i ^ ((uint64_t)r << 40));
        for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i ^ ((uint64_t)r << 40));
        free_TM(a);
        if (pause_ms > 0) usleep(pause_ms * 1000);
    }
    CHECK(bad == 0, "%lu words wrong", (unsigned long)bad);
    printf("reuse: %d rounds of %zu MiB\n", rounds, mib);
    CHECK_DONE();
}
