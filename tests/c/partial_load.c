/* A load that fails part-way (ATTUNE_INJECT=load-fail-half:N: the N-th load of a run of
 * two chunks or more places the first half of its run, then fails with EIO, as a medium
 * that breaks mid-run would). A forward pass over a region pushed out of DRAM hits it.
 * What the failed run had placed is the tier's data: it reads right, counts in the
 * region's resident bytes and can be evicted again; only the rest fails.
 *   `poisoned` (thread delivery with UFFDIO_POISON): the pages the failed part held raise SIGBUS
 *     (they are poisoned), one contiguous stretch, every time they are read; every
 *     other page reads right; the page just before the stretch (placed by the failed
 *     run, mapped when the stretch begins) leaves DRAM as the pass goes on;
 *   `retried` (signal delivery, or thread delivery without UFFDIO_POISON): the faulting
 *     access was to the placed half, so nothing raises SIGBUS (the failed half stays far
 *     and the next access fetches it again) and every page reads right.
 * Either way one load error is counted. A program's own SIGBUS handler (installed after
 * the runtime, as sigbus_chain.c does) catches the signals. Budget: 16 MiB. */
#define _GNU_SOURCE
#include <attune.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "engine_stats.h"

#define PAGE 4096
#define WPP (PAGE / 8)

static sigjmp_buf jb;
static void on_bus(int s) { (void)s; siglongjmp(jb, 1); }

static uint64_t *a;
static size_t words, pages;
static attune_alloc_opts o;

/* Pushes `a` out of DRAM with a region of new pages (zero-filled, never loaded: the
 * loads the injection counts are `a`'s only). */
static void push_out(void) {
    void *other = attune_alloc(words * 8, &o);
    CHECK(other != NULL, "attune_alloc: %s", attune_last_error());
    if (!other) return;
    memset(other, 1, words * 8);
    attune_free(other);
}

/* Reads page p: 0 right, 1 wrong, 2 SIGBUS. */
static int read_page(size_t p) {
    if (sigsetjmp(jb, 1)) return 2;
    volatile uint64_t *w = a + p * WPP;
    return w[0] != mix64(p * WPP) || w[WPP - 1] != mix64(p * WPP + WPP - 1);
}

int main(int argc, char **argv) {
    int poisoned = argc > 1 && !strcmp(argv[1], "poisoned");
    alarm(60); /* a woken thread left waiting is the failure */
    const size_t len = 48 << 20;
    attune_alloc_opts_init(&o);
    o.chunk_size = PAGE;
    a = attune_alloc(len, &o);
    CHECK(a != NULL, "attune_alloc: %s", attune_last_error());
    if (!a) CHECK_DONE();
    words = len / 8;
    pages = len / PAGE;
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_bus;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction");

    push_out();
    uint64_t errors0 = engine_counter("load_errors");
    size_t bus = 0, wrong = 0, first = 0, last = 0, mapped_before = 0;
    for (size_t p = 0; p < pages; p++) {
        int r = read_page(p);
        if (r == 2) {
            /* The page before the stretch was placed by the failed run, just now. */
            if (!bus++ && (first = p) > 0) mapped_before = resident_bytes((char *)a + (p - 1) * PAGE, PAGE);
            last = p;
        }
        wrong += r == 1;
    }
    uint64_t errors = engine_counter("load_errors") - errors0;
    printf("partial_load: %zu pages raised SIGBUS (%zu..%zu), %zu wrong, %llu load errors\n", bus, first, last,
           wrong, (unsigned long long)errors);
    CHECK(wrong == 0, "%zu pages read wrong", wrong);
    CHECK(errors == 1, "%llu load errors (1 injected)", (unsigned long long)errors);
    if (!poisoned) {
        CHECK(bus == 0, "%zu pages raised SIGBUS, the first %zu (the access's page was placed)", bus, first);
        CHECK_DONE();
    }
    CHECK(bus > 0 && last - first + 1 == bus, "SIGBUS on %zu pages, not one stretch (%zu..%zu)", bus, first, last);
    if (!bus || !first) CHECK_DONE();
    /* Still failing: the failed part stays poisoned. */
    CHECK(read_page(first) == 2, "page %zu read again without SIGBUS", first);
    /* The placed half leaves DRAM under pressure like any page: the rest of the pass (32
     * MiB past it) and a sweep of a new region. Published as Far, it stayed mapped. */
    CHECK(mapped_before == PAGE, "page %zu, before the stretch, was not mapped when it failed", first - 1);
    push_out();
    CHECK(resident_bytes((char *)a + (first - 1) * PAGE, PAGE) == 0,
          "page %zu, placed by the failed run, stayed in DRAM through the pass and a sweep", first - 1);
    CHECK(read_page(first - 1) == 0, "page %zu read wrong after its eviction", first - 1);
    CHECK_DONE();
}
