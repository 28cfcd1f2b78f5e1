/* fork: a child inherits the managed memory of its parent and reads and writes it as its
 * own (crate::fork), whatever tier each chunk was in at the fork; the parent's data is
 * untouched by the child's writes and the child's view by the parent's; the child's
 * resident managed memory stays within the budget. Also: forks while another thread
 * faults, a grandchild, small blocks, a signal-delivery region, free in the child.
 * Run with the memory tier and with a file tier (scripts/test.sh). */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include "check.h"

static size_t bad_words(const uint64_t *a, size_t words, uint64_t seed) {
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != (mix64(i) ^ seed);
    return bad;
}

static void fill(uint64_t *a, size_t words, uint64_t seed) {
    for (size_t i = 0; i < words; i++) a[i] = mix64(i) ^ seed;
}

/* In a child: exit status = 0 if all checks pass, else a code naming the first failure. */
static int child_checks(uint64_t *a, size_t words, size_t budget) {
    attune_region_stats_t st;
    if (attune_region_stats(a, &st) != 0) return 10;
    uint64_t far = 0;
    for (uint32_t t = 1; t < st.ntiers; t++) far += st.tier_bytes[t];
    if (far == 0) return 11;                      /* the test must fork with chunks out of DRAM */
    if (bad_words(a, words, 0) != 0) return 12;   /* the parent's data as it was at the fork */
    fill(a, words, 0xC41D);                       /* the child's own writes, evicted and refetched */
    size_t peak = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (bad_words(a, words, 0xC41D) != 0) return 13;
        size_t r = resident_bytes(a, words * 8);
        if (r > peak) peak = r;
    }
    if (peak > budget + (2u << 20)) return 14;
    if (attune_region_stats(a, &st) != 0 || st.faults == 0) return 15; /* served here */
    free_TM(a);                                   /* the child's copy only */
    return 0;
}

struct reader { uint64_t *a; size_t words; atomic_int stop; atomic_size_t bad, reads; };

static void *read_randomly(void *arg) {
    struct reader *r = arg;
    uint64_t x = 88172645463325252ull;
    while (!atomic_load(&r->stop)) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t i = x % r->words;
        if (r->a[i] != mix64(i)) atomic_fetch_add(&r->bad, 1);
        atomic_fetch_add(&r->reads, 1);
    }
    return NULL;
}

int main(void) {
    size_t budget = env_size("TEST_BUDGET", 16u << 20);
    size_t n = 3 * budget, words = n / 8;
    uint64_t *a = allocate_TM(n, ATTUNE_BW);
    CHECK(a != NULL, "alloc %zu", n);
    if (!a) CHECK_DONE();
    fill(a, words, 0);

    /* 1. Three children at once read and rewrite their copies while the parent rewrites
     *    its own. */
    pid_t kids[3];
    for (int k = 0; k < 3; k++) {
        kids[k] = fork();
        if (kids[k] == 0) _exit(child_checks(a, words, budget));
    }
    fill(a, words, 1);
    for (int k = 0; k < 3; k++) {
        int st = 0; waitpid(kids[k], &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x (exit code names the check)", k, st);
    }
    CHECK(bad_words(a, words, 1) == 0, "parent's data after its children ran");

    /* 2. A grandchild sees what its parent (the child) had at its fork. */
    pid_t c = fork();
    if (c == 0) {
        fill(a, words, 2);
        pid_t g = fork();
        if (g == 0) _exit(bad_words(a, words, 2) ? 21 : 0);
        fill(a, words, 3);
        int st = 0; waitpid(g, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) _exit(22);
        _exit(bad_words(a, words, 3) ? 23 : 0);
    }
    int st = 0; waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "grandchild chain: status %#x", st);
    CHECK(bad_words(a, words, 1) == 0, "parent's data after the grandchild chain");

    /* 3. Forks while another thread faults all over the region. */
    fill(a, words, 0);
    struct reader rd = { .a = a, .words = words };
    pthread_t th; pthread_create(&th, NULL, read_randomly, &rd);
    for (int k = 0; k < 8; k++) {
        pid_t p = fork();
        if (p == 0) _exit(bad_words(a, words, 0) ? 31 : 0);
        waitpid(p, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "fork %d under concurrent faults: status %#x", k, st);
    }
    atomic_store(&rd.stop, 1);
    pthread_join(th, NULL);
    CHECK(rd.bad == 0 && rd.reads > 0, "concurrent reader: %zu bad of %zu", (size_t)rd.bad, (size_t)rd.reads);

    /* 4. (Before any small block: a small-object arena reserves its whole virtual size in
     *    every far tier, which a small file tier cannot also give this region.)
     *    A chunk evicted with a page the application had discarded (MADV_DONTNEED) is
     *    fetched in the child with its pages shared: the discarded page reads as zero,
     *    every other word as it was. */
    attune_alloc_opts ho; attune_alloc_opts_init(&ho);
    ho.chunk_size = 64 << 10;
    size_t hn = 3 * budget, hw = hn / 8, per = (64 << 10) / 8;
    uint64_t *h = attune_alloc(hn, &ho);
    CHECK(h != NULL, "64K-chunk alloc: %s", attune_last_error());
    if (h) {
        for (size_t c = 0; c < hw / per; c++) {  /* page 5 of every chunk, discarded while */
            for (size_t i = c * per; i < (c + 1) * per; i++) h[i] = mix64(i) ^ 9;  /* resident */
            madvise(h + c * per + 5 * 512, 4096, MADV_DONTNEED);
        }
        uint64_t sum = 0;                        /* cycle the rest through the far tier */
        for (size_t i = 0; i < hw; i++) if ((i % per) / 512 != 5) sum += h[i];
        (void)sum;
        pid_t c = fork();
        if (c == 0) {
            for (size_t i = 0; i < hw; i++) {
                uint64_t want = (i % per) / 512 == 5 ? 0 : (mix64(i) ^ 9);
                if (h[i] != want) _exit(51);
            }
            _exit(0);
        }
        waitpid(c, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "discarded pages in the child: status %#x", st);
        attune_free(h);
    }
    /* 5. Small blocks and a signal-delivery region are inherited too. */
    uint64_t *sm = allocate_TM(64, ATTUNE_LAT);
    CHECK(sm != NULL, "small alloc");
    for (int i = 0; i < 8; i++) sm[i] = mix64(1000 + i);
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.fault_mode = ATTUNE_FAULT_SIGNAL;
    size_t sn = 2 * budget, sw = sn / 8;
    uint64_t *sg = attune_alloc(sn, &o);
    CHECK(sg != NULL, "signal-mode alloc");
    if (sg) fill(sg, sw, 7);
    c = fork();
    if (c == 0) {
        for (int i = 0; i < 8; i++) if (sm[i] != mix64(1000 + i)) _exit(41);
        free_TM(sm);
        uint64_t *more = allocate_TM(64, ATTUNE_LAT);
        if (!more) _exit(42);
        more[0] = 5;
        free_TM(more);
        if (sg && bad_words(sg, sw, 7)) _exit(43);
        if (sg) { fill(sg, sw, 8); if (bad_words(sg, sw, 8)) _exit(44); }
        _exit(0);
    }
    waitpid(c, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "small blocks and signal region in the child: status %#x", st);
    for (int i = 0; i < 8; i++) CHECK(sm[i] == mix64(1000 + i), "small block word %d in the parent", i);
    if (sg) CHECK(bad_words(sg, sw, 7) == 0, "signal region in the parent");
    CHECK(bad_words(a, words, 0) == 0, "parent's region after the child freed its copy");
    free_TM(sm);
    if (sg) attune_free(sg);
    free_TM(a);
    printf("fork_inherit: ok (%zu MiB region, 3x the budget)\n", n >> 20);
    CHECK_DONE();
}
