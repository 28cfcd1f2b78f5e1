/* A thread frees a region right after a fault whose read-ahead run is still being placed:
 * no placement may fail (no "could not be read back (ENOENT)"), and a region mapped at the
 * same address afterwards reads zero everywhere (no page of the old one placed into it).
 * The region's protection is split every 128 KiB (mprotect of one page) so that every
 * run crosses a VMA boundary: a copy stops there, and before the run was woken once whole
 * (docs/design/paging.md, "No wake before the whole run", with the figures) its first
 * part woke the thread. Run with each fault delivery. Budget: $TEST_BUDGET (16 MiB in scripts/test.sh). */
#define _GNU_SOURCE
#include <attune.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "engine_stats.h"

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 60;
    size_t bytes = 16u << 20, words = bytes / 8, ps = 4096;
    uint64_t nonzero = 0, wrong = 0;
    for (int it = 0; it < rounds; it++) {
        uint64_t *a = allocate_TM(bytes, 0);
        CHECK(a, "alloc: %s", attune_last_error());
        if (!a) break;
        for (size_t i = 0; i < words; i++) a[i] = mix64(i ^ (uint64_t)it << 40);
        /* A second region pushes most of the first out. */
        uint64_t *b = allocate_TM(bytes, 0);
        CHECK(b, "alloc: %s", attune_last_error());
        if (!b) break;
        for (size_t i = 0; i < words; i += 512) b[i] = i;
        for (size_t off = 68 << 10; off + ps < bytes; off += 128 << 10)
            CHECK(mprotect((char *)a + off, ps, PROT_READ) == 0, "mprotect");
        /* A sequential read (read-ahead runs) that stops part-way, and the free. */
        size_t stop = (bytes / 2 + (size_t)(it % 64) * ps) / 8;
        for (size_t i = 0; i < stop; i += 512) wrong += a[i] != mix64(i ^ (uint64_t)it << 40);
        free_TM(a);
        uint64_t *c = allocate_TM(bytes, 0);
        CHECK(c, "alloc: %s", attune_last_error());
        if (!c) break;
        for (size_t i = 0; i < words; i++) nonzero += c[i] != 0;
        free_TM(c);
        free_TM(b);
    }
    uint64_t errors = engine_counter("load_errors");
    CHECK(wrong == 0, "%lu words read back wrong", (unsigned long)wrong);
    CHECK(nonzero == 0, "%lu words of a new region were not zero", (unsigned long)nonzero);
    CHECK(errors == 0, "%lu placements failed", (unsigned long)errors);
    printf("free_in_run: %d rounds, %lu load errors, %lu nonzero words\n", rounds,
           (unsigned long)errors, (unsigned long)nonzero);
    CHECK_DONE();
}
