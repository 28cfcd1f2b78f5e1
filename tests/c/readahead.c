/* Adaptive read-ahead (attune_policy::readahead) on a 48 MiB region of 4 KiB chunks under
 * a 16 MiB budget: each pattern reads the whole region (or its stride's share of pages)
 * after the region was pushed out by a sweep of another one, and checks every value it
 * reads. Per pattern, from the region's counters:
 *   forward, backward   faults at most 1/16 of the pages read (the window grows), and
 *                       read-ahead chunks counted;
 *   4 threads           each streams its quarter at once: faults at most 1/8 of the pages;
 *   stride 8 pages      faults at most 1/4 of the pages on the stride, and at most 1.25x
 *                       the pages on the stride fetched (the pages between stay out);
 *   random              8-byte reads: fetched at most 1.5x the 4 KiB pages that faulted
 *                       (a page each, nothing read ahead).
 * The engine's readahead_used_bytes: at least 90% of the forward pass's read-ahead shown
 * used by the run going on past it.
 * `readahead copied`: the far tier copies runs into place (file, pool, remote), so no fault
 * of the forward pass fetches more than 256 KiB (tier::COPIED_RUN); `readahead moved`:
 * it moves pages (memory), and the forward pass's faults fetch more than 256 KiB on
 * average (the window grows to `readahead`, 1 MiB).
 * Run under both fault deliveries (ATTUNE_FAULT_MODE). */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <string.h>
#include "check.h"
#include "engine_stats.h"

#define PAGE 4096
#define WPP (PAGE / 8) /* words per page */

static uint64_t *a, *other;
static size_t words, pages, bad;
static pthread_mutex_t bad_lock = PTHREAD_MUTEX_INITIALIZER;

static void check_page(size_t p) {
    size_t w = p * WPP;
    if (a[w] != mix64(w) || a[w + WPP - 1] != mix64(w + WPP - 1)) {
        pthread_mutex_lock(&bad_lock);
        bad++;
        pthread_mutex_unlock(&bad_lock);
    }
}

/* Pushes `a` out of DRAM: a pass over the other region, twice the budget. */
static void push_out(void) {
    for (size_t i = 0; i < words; i += WPP) other[i] += 1;
}

static attune_region_stats_t before;
static void start(void) {
    push_out();
    attune_region_stats(a, &before);
}
static attune_region_stats_t delta(void) {
    attune_region_stats_t s;
    attune_region_stats(a, &s);
    s.faults -= before.faults;
    s.fetched_bytes -= before.fetched_bytes;
    s.readahead_chunks -= before.readahead_chunks;
    return s;
}

struct part { size_t lo, hi; };
static void *stream(void *arg) {
    struct part *p = arg;
    for (size_t q = p->lo; q < p->hi; q++) check_page(q);
    return NULL;
}

int main(int argc, char **argv) {
    const char *tier = argc > 1 ? argv[1] : "";
    const size_t len = 48 << 20;
    attune_alloc_opts o;
    attune_alloc_opts_init(&o);
    o.chunk_size = PAGE;
    a = attune_alloc(len, &o);
    other = attune_alloc(len, &o);
    CHECK(a && other, "attune_alloc: %s", attune_last_error());
    if (!a || !other) CHECK_DONE();
    words = len / 8;
    pages = len / PAGE;
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    memset(other, 1, len);

    start();
    uint64_t ra0 = engine_counter("readahead_bytes"), used0 = engine_counter("readahead_used_bytes");
    for (size_t p = 0; p < pages; p++) check_page(p);
    attune_region_stats_t s = delta();
    uint64_t ra = engine_counter("readahead_bytes") - ra0, used = engine_counter("readahead_used_bytes") - used0;
    printf("readahead: forward: %.1f of %.1f MiB read ahead shown used\n", used / 1048576.0, ra / 1048576.0);
    CHECK(ra > 0 && used * 10 >= ra * 9, "forward: %llu of %llu bytes read ahead shown used",
          (unsigned long long)used, (unsigned long long)ra);
    printf("readahead: forward: %llu faults, %llu chunks read ahead for %zu pages\n",
           (unsigned long long)s.faults, (unsigned long long)s.readahead_chunks, pages);
    CHECK(s.faults * 16 <= pages, "forward: %llu faults for %zu pages", (unsigned long long)s.faults, pages);
    CHECK(s.readahead_chunks > 0, "forward: nothing read ahead");
    const uint64_t run = 256 << 10;
    if (!strcmp(tier, "copied"))
        CHECK(s.fetched_bytes <= s.faults * run, "forward, copying tier: %llu bytes fetched by %llu faults",
              (unsigned long long)s.fetched_bytes, (unsigned long long)s.faults);
    if (!strcmp(tier, "moved"))
        CHECK(s.fetched_bytes > s.faults * run, "forward, moved tier: %llu bytes fetched by %llu faults",
              (unsigned long long)s.fetched_bytes, (unsigned long long)s.faults);

    start();
    for (size_t p = pages; p-- > 0;) check_page(p);
    s = delta();
    printf("readahead: backward: %llu faults, %llu chunks read ahead\n", (unsigned long long)s.faults,
           (unsigned long long)s.readahead_chunks);
    CHECK(s.faults * 16 <= pages, "backward: %llu faults for %zu pages", (unsigned long long)s.faults, pages);

    start();
    pthread_t th[4];
    struct part parts[4];
    for (int k = 0; k < 4; k++) {
        parts[k] = (struct part){pages / 4 * k, pages / 4 * (k + 1)};
        pthread_create(&th[k], NULL, stream, &parts[k]);
    }
    for (int k = 0; k < 4; k++) pthread_join(th[k], NULL);
    s = delta();
    printf("readahead: 4 threads: %llu faults\n", (unsigned long long)s.faults);
    CHECK(s.faults * 8 <= pages, "4 threads: %llu faults for %zu pages", (unsigned long long)s.faults, pages);

    start();
    size_t on = 0;
    for (size_t p = 3; p < pages; p += 8, on++) check_page(p);
    s = delta();
    printf("readahead: stride 8: %llu faults, %.1f MiB fetched for %zu pages on the stride\n",
           (unsigned long long)s.faults, s.fetched_bytes / 1048576.0, on);
    CHECK(s.faults * 4 <= on, "stride 8: %llu faults for %zu pages", (unsigned long long)s.faults, on);
    CHECK(s.fetched_bytes * 4 <= (uint64_t)on * PAGE * 5, "stride 8: %llu bytes fetched for %zu pages",
          (unsigned long long)s.fetched_bytes, on);

    start();
    uint64_t x = 88172645463325252ull;
    for (size_t k = 0; k < pages; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t w = x % words;
        if (a[w] != mix64(w)) bad++;
    }
    s = delta();
    printf("readahead: random: %llu faults, %.1f MiB fetched, %llu chunks read ahead\n",
           (unsigned long long)s.faults, s.fetched_bytes / 1048576.0, (unsigned long long)s.readahead_chunks);
    CHECK(s.fetched_bytes * 2 <= s.faults * PAGE * 3, "random: %llu bytes fetched for %llu faults",
          (unsigned long long)s.fetched_bytes, (unsigned long long)s.faults);

    CHECK(bad == 0, "%zu pages read wrong", bad);
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "%zu words wrong at the end", bad);
    attune_free(a);
    attune_free(other);
    CHECK_DONE();
}
