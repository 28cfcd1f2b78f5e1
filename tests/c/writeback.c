/* Write-back of only what changed (attune_policy::writeback) to a file tier, with the
 * chunk size from ATTUNE_CHUNK_SIZE (4 KiB pages and 64 KiB chunks). Two 48 MiB regions
 * under a 16 MiB budget, so each pass over one pushes the other out:
 *   clean    A read back and pushed out unchanged: at least 95% of what A evicts is
 *            not written again (the file holds it: engine counter clean_bytes);
 *   sparse   one word changed in every 64th 4 KiB page of A: at least 90% not written
 *            again (a 64 KiB chunk with one changed page writes that page, and a 2 MiB
 *            run with 8 writes 8 pages);
 *   check    every word of A and B read back through the file: what was written in
 *            pieces combines with what was not.
 * Each pass over A is followed by one over B that changes every page of B, so the clean
 * bytes counted are A's.
 * Run under both fault deliveries (ATTUNE_FAULT_MODE). */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include "check.h"
#include "engine_stats.h"

#define PAGE 4096
#define WPP (PAGE / 8)

static uint64_t *a, *b;
static size_t words;

/* The expected word i of A after `sparse` (every 64th page's first word bumped). */
static uint64_t a_word(size_t i, int bumped) {
    return mix64(i) + (bumped && i % (64 * WPP) == 0);
}

static uint64_t a_evicted(void) {
    attune_region_stats_t s;
    attune_region_stats(a, &s);
    return s.evicted_bytes;
}

/* A pass over B, which pushes A out. It changes every page of B, so that B's evictions
 * are never clean: clean_bytes then counts A's alone. */
static uint64_t b_gen;
static size_t pass_b(void) {
    size_t bad = 0;
    for (size_t i = 0; i < words; i += WPP / 4) {
        bad += b[i] != ~mix64(i) + b_gen;
        b[i] += 1;
    }
    b_gen++;
    return bad;
}

int main(void) {
    const size_t len = 48 << 20;
    words = len / 8;
    a = allocate_TM(len, 0);
    b = allocate_TM(len, 0);
    CHECK(a && b, "allocate_TM: %s", attune_last_error());
    if (!a || !b) CHECK_DONE();
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    for (size_t i = 0; i < words; i++) b[i] = ~mix64(i);
    CHECK(engine_counter("clean_bytes") != UINT64_MAX, "no clean_bytes counter");

    /* clean: A comes back (its hashes recorded as it loads) and is pushed out unchanged. */
    size_t bad = 0;
    uint64_t c0 = engine_counter("clean_bytes"), e0 = a_evicted();
    for (size_t i = 0; i < words; i++) bad += a[i] != a_word(i, 0);
    bad += pass_b();
    uint64_t clean = engine_counter("clean_bytes") - c0, ev = a_evicted() - e0;
    printf("writeback: clean: %.1f of %.1f MiB evicted from A not written again\n", clean / 1048576.0,
           ev / 1048576.0);
    CHECK(ev >= (16u << 20), "clean: A evicted only %llu bytes", (unsigned long long)ev);
    CHECK(clean * 100 >= ev * 95, "clean: %llu of %llu bytes not written again", (unsigned long long)clean,
          (unsigned long long)ev);

    /* sparse: one word in every 64th page changes. */
    c0 = engine_counter("clean_bytes");
    e0 = a_evicted();
    for (size_t i = 0; i < words; i++) {
        bad += a[i] != a_word(i, 0);
        if (i % (64 * WPP) == 0) a[i] += 1;
    }
    bad += pass_b();
    clean = engine_counter("clean_bytes") - c0;
    ev = a_evicted() - e0;
    printf("writeback: sparse: %.1f of %.1f MiB evicted from A not written again\n", clean / 1048576.0,
           ev / 1048576.0);
    CHECK(ev >= (16u << 20), "sparse: A evicted only %llu bytes", (unsigned long long)ev);
    CHECK(clean * 100 >= ev * 90, "sparse: %llu of %llu bytes not written again", (unsigned long long)clean,
          (unsigned long long)ev);

    /* check: everything, through the file, twice over. */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < words; i++) bad += a[i] != a_word(i, 1);
        bad += pass_b();
    }
    CHECK(bad == 0, "%zu words wrong", bad);
    free_TM(a);
    free_TM(b);
    CHECK_DONE();
}
