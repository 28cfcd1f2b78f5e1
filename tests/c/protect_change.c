/* Protection changes on managed memory keep their meaning (run with each fault delivery):
 * a read-only range reads back its data from a far tier, a write to it faults as without
 * Attune, a PROT_NONE guard page faults on access and keeps its content, data survives
 * pressure while protected and after the protection is restored, and evictions skip the
 * protected chunks (counted) instead of failing the tier. Budget: $TEST_BUDGET. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "engine_stats.h"

static sigjmp_buf jb;
static volatile sig_atomic_t segv;
static void on_segv(int s) { (void)s; segv++; siglongjmp(jb, 1); }

/* Reads (or writes) *p and tells whether that faulted with SIGSEGV. */
static int faults_on_read(volatile uint64_t *p) {
    int before = segv;
    if (!sigsetjmp(jb, 1)) { uint64_t v = *p; (void)v; }
    return segv != before;
}
static int faults_on_write(volatile uint64_t *p, uint64_t v) {
    int before = segv;
    if (!sigsetjmp(jb, 1)) *p = v;
    return segv != before;
}

int main(void) {
    size_t bytes = 48u << 20, words = bytes / 8, ps = 4096;
    uint64_t *a = allocate_TM(bytes, 0), *b = allocate_TM(bytes, 0);
    CHECK(a && b, "alloc: %s", attune_last_error());
    if (!a || !b) return 1;
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, NULL);
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    for (size_t i = 0; i < words; i++) b[i] = i; /* most of a goes to the far tier */
    uint64_t skips0 = engine_counter("protected_skips");
    CHECK(skips0 != UINT64_MAX, "protected_skips in attune_stats_json");

    /* Read-only: every word reads back (fetched into a read-only mapping). */
    CHECK(mprotect(a, bytes, PROT_READ) == 0, "mprotect read-only");
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "read-only: %lu bad words", bad);
    /* A write faults as it would without Attune, and changes nothing. */
    CHECK(faults_on_write(&a[12345], 7), "a write to a read-only page did not fault");
    CHECK(a[12345] == mix64(12345), "the refused write changed the word");
    /* A guard page inside: faults on access; its neighbours do not. */
    size_t g = (8u << 20) / 8;
    CHECK(mprotect(&a[g], ps, PROT_NONE) == 0, "mprotect none");
    CHECK(faults_on_read(&a[g]) && faults_on_read(&a[g + 511]), "a PROT_NONE page did not fault");
    CHECK(!faults_on_read(&a[g - 1]) && !faults_on_read(&a[g + 512]), "a guard page's neighbour faulted");
    /* Pressure while protected: the protected chunks stay (and are counted), the data holds. */
    for (int r = 0; r < 2; r++)
        for (size_t i = 0; i < words; i++) b[i] += 1;
    bad = 0;
    for (size_t i = 0; i < words; i++) if (i < g || i >= g + 512) bad += a[i] != mix64(i);
    CHECK(bad == 0, "read-only under pressure: %lu bad words", bad);
    /* Pages leave by UFFDIO_MOVE, which needs the same protection on both sides: protected
     * chunks stay. Where pages leave by copy under write protection (no UFFDIO_MOVE,
     * EXPECT_PROTECTED_EVICTED=1), read-only chunks go far like the others. */
    if (!getenv("EXPECT_PROTECTED_EVICTED"))
        CHECK(engine_counter("protected_skips") > skips0, "no eviction met a protected chunk");
    /* Back to read-write: the guard page kept its content; writes work and persist. */
    CHECK(mprotect(a, bytes, PROT_READ | PROT_WRITE) == 0, "mprotect read-write");
    CHECK(a[g] == mix64(g) && a[g + 511] == mix64(g + 511), "the guard page lost its content");
    for (size_t i = 0; i < words; i++) a[i] += 1;
    for (size_t i = 0; i < words; i++) b[i] += 1;
    bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i) + 1;
    CHECK(bad == 0, "after read-write again: %lu bad words", bad);
    /* Protection keys where the CPU has them (pkey_mprotect's pages differ in their key). */
    int key = pkey_alloc(0, 0);
    if (key >= 0) {
        for (size_t i = 0; i < words; i++) b[i] += 1;
        CHECK(pkey_mprotect(a, bytes / 2, PROT_READ, key) == 0, "pkey_mprotect");
        bad = 0;
        for (size_t i = 0; i < words / 2; i++) bad += a[i] != mix64(i) + 1;
        CHECK(bad == 0, "pkey read-only: %lu bad words", bad);
        pkey_mprotect(a, bytes / 2, PROT_READ | PROT_WRITE, key);
        pkey_free(key);
    } else {
        printf("protect_change: no protection keys here (pkey_alloc: %s)\n", strerror(errno));
    }
    /* Fresh memory with a guard page inside, first touched in order: a zero-filled run of
     * the read-ahead crosses the boundaries the mprotect made (one UFFDIO_COPY fills one
     * VMA), and each side is placed; before, the access failed with SIGBUS. */
    size_t cw = words / 4, cg = cw / 2;
    uint64_t *c = allocate_TM(cw * 8, 0);
    CHECK(c && mprotect(&c[cg], ps, PROT_NONE) == 0, "fresh region with a guard page");
    if (c) {
        for (size_t i = 0; i < cw; i++) if (i < cg || i >= cg + 512) c[i] = mix64(i);
        bad = 0;
        for (size_t i = 0; i < cw; i++) if (i < cg || i >= cg + 512) bad += c[i] != mix64(i);
        CHECK(bad == 0, "fresh region around a guard page: %lu bad words", bad);
        CHECK(faults_on_read(&c[cg]), "the fresh region's guard page did not fault");
        free_TM(c);
    }
    free_TM(a);
    free_TM(b);
    CHECK_DONE();
}
