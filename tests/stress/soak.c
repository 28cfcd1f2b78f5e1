/* The soak: for SOAK_SECONDS, SOAK_THREADS threads (3 per CPU by default, as the kernel's
 * uffd-stress) work on managed regions several times the budget and check every page they
 * touch. Mixed in: frees and re-allocations, flag changes, pins, discards, prefetches, a
 * region all threads update at once, and forks whose children check a snapshot. The budget
 * varies when a daemon grants it (tests/stress/soak.sh starts one and a neighbour that
 * comes and goes).
 *
 * Page layout of a thread's region: word 0 = tag (region serial << 20 | page), word 1 =
 * version, words 2..7 = mix64(tag ^ version + k). The thread keeps each page's version, so
 * a lost write, a stale page, a page of another region or a torn page is caught.
 *
 * Prints "soak: ... N page checks, M pages moved between tiers ..., E errors" and exits
 * non-zero on any error. */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include "../c/check.h"

#define PAGE 4096
#define SLOTS 3
static const int FLAGS[] = {0, ATTUNE_LAT, ATTUNE_BW, ATTUNE_CAP, ATTUNE_SHL, ATTUNE_BW | ATTUNE_CAP};

static atomic_ulong checks, errors, ops[8];
static atomic_int stop;
static size_t region_max;
static uint64_t *common; static size_t common_words;   /* updated by every thread */
static atomic_ulong common_adds;
static uint64_t budget_min = UINT64_MAX, budget_max;   /* DRAM budget seen, by the forker */

/* small: below the runtime's 1 MiB region threshold, served from the small arenas, whose
 * flags are their class's and which take no discard. */
typedef struct { uint64_t *p; size_t pages; uint32_t serial; uint32_t *ver; int small; } slot_t;

static uint64_t rnd(uint64_t *x) { *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17; return *x; }

static void stamp(slot_t *s, size_t pg) {
    uint64_t *w = s->p + pg * (PAGE / 8);
    uint64_t tag = ((uint64_t)s->serial << 20) | pg, v = s->ver[pg];
    for (int k = 2; k < 8; k++) w[k] = mix64(tag ^ (v + k));
    w[1] = v; w[0] = tag;
}

static void verify(slot_t *s, size_t pg, const char *when) {
    uint64_t *w = s->p + pg * (PAGE / 8);
    uint64_t tag = ((uint64_t)s->serial << 20) | pg, v = s->ver[pg];
    int bad = w[0] != tag || w[1] != v;
    for (int k = 2; k < 8 && !bad; k++) bad = w[k] != mix64(tag ^ (v + k));
    checks++;
    if (bad) {
        if (atomic_fetch_add(&errors, 1) < 10)
            fprintf(stderr, "soak: %s: region %u page %zu: tag %#lx/%#lx version %lu/%lu\n", when,
                    s->serial, pg, (unsigned long)w[0], (unsigned long)tag, (unsigned long)w[1],
                    (unsigned long)v);
    }
}

static atomic_uint serials;
static atomic_ulong regions_by_mode[3];
static void fill(slot_t *s, uint64_t *x) {
    s->pages = (PAGE * 16 + rnd(x) % region_max) / PAGE;
    s->serial = atomic_fetch_add(&serials, 1) + 1;
    s->small = s->pages * PAGE < (1 << 20);
    if (s->small) {
        s->p = allocate_TM(s->pages * PAGE, FLAGS[rnd(x) % 6]);
    } else {
        /* A region: any chunk size, either fault delivery. */
        static const size_t chunks[] = {4096, 65536, 2 << 20};
        attune_alloc_opts o; attune_alloc_opts_init(&o);
        o.flags = FLAGS[rnd(x) % 6];
        o.chunk_size = chunks[rnd(x) % 3];
        o.fault_mode = rnd(x) % 2 ? ATTUNE_FAULT_SIGNAL : ATTUNE_FAULT_THREAD;
        s->p = attune_alloc(s->pages * PAGE, &o);
        regions_by_mode[o.fault_mode]++;
    }
    s->ver = calloc(s->pages, sizeof *s->ver);
    if (!s->p || !s->ver) { fprintf(stderr, "soak: allocation failed: %s\n", attune_last_error()); exit(2); }
    for (size_t pg = 0; pg < s->pages; pg++) stamp(s, pg);
}

static void drop(slot_t *s) {
    for (size_t pg = 0; pg < s->pages; pg++) verify(s, pg, "before free");
    free_TM(s->p); free(s->ver);
}

static void *worker(void *arg) {
    uint64_t x = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
    slot_t sl[SLOTS];
    for (int i = 0; i < SLOTS; i++) fill(&sl[i], &x);
    while (!stop) {
        slot_t *s = &sl[rnd(&x) % SLOTS];
        size_t pg = rnd(&x) % s->pages;
        unsigned r = rnd(&x) % 1000;
        if (r < 900) {                 /* a page: check, new version */
            verify(s, pg, "access"); s->ver[pg]++; stamp(s, pg);
        } else if (r < 960) {          /* the common region: everyone adds at once */
            __atomic_fetch_add(&common[rnd(&x) % common_words], 1, __ATOMIC_RELAXED);
            common_adds++;
        } else if (r < 970) {          /* a new region */
            drop(s); fill(s, &x); ops[0]++;
        } else if (r < 980 && !s->small) { /* other flags */
            if (attune_set_flags(s->p, FLAGS[rnd(&x) % 6]) != 0) { errors++; fprintf(stderr, "soak: set_flags: %s\n", attune_last_error()); }
            ops[1]++;
        } else if (r < 988) {          /* pin a few pages for a while, then unpin */
            size_t n = 1 + rnd(&x) % 8; if (pg + n > s->pages) n = s->pages - pg;
            if (attune_pin(s->p + pg * (PAGE / 8), n * PAGE) == 0) {
                for (size_t k = pg; k < pg + n; k++) { verify(s, k, "pinned"); s->ver[k]++; stamp(s, k); }
                attune_unpin(s->p + pg * (PAGE / 8), n * PAGE);
            }
            ops[2]++;
        } else if (r < 995 && !s->small) { /* discard pages: they read as zero, then stamped again */
            size_t n = 1 + rnd(&x) % 16; if (pg + n > s->pages) n = s->pages - pg;
            if (attune_discard(s->p + pg * (PAGE / 8), n * PAGE) != 0) { errors++; fprintf(stderr, "soak: discard: %s\n", attune_last_error()); }
            for (size_t k = pg; k < pg + n; k++) {
                uint64_t *w = s->p + k * (PAGE / 8);
                checks++;
                if (w[0] || w[1] || w[7]) { errors++; fprintf(stderr, "soak: discarded page %zu not zero\n", k); }
                s->ver[k] = 0; stamp(s, k);
            }
            ops[3]++;
        } else if (r >= 995) {         /* read ahead */
            size_t n = 1 + rnd(&x) % 32; if (pg + n > s->pages) n = s->pages - pg;
            attune_prefetch(s->p + pg * (PAGE / 8), n * PAGE); ops[4]++;
        }
    }
    for (int i = 0; i < SLOTS; i++) drop(&sl[i]);
    return NULL;
}

static int forks = 1;   /* SOAK_FORKS=0: no forks (a tier whose pages a child cannot see) */

/* Forks while the workers run: the child checks a snapshot of a region only this thread
 * writes, writes its own copy, and exits; the parent's copy must be untouched. */
static void *forker(void *arg) {
    (void)arg;
    uint64_t x = 77;
    slot_t s; fill(&s, &x);
    while (!stop) {
        for (size_t pg = 0; pg < s.pages; pg++) { s.ver[pg]++; stamp(&s, pg); }
        if (forks) {
            unsigned long before = errors;
            pid_t c = fork();
            if (c == 0) {
                for (size_t pg = 0; pg < s.pages; pg++) verify(&s, pg, "child");
                for (size_t pg = 0; pg < s.pages; pg++) { s.ver[pg] += 1000; stamp(&s, pg); }
                _exit(errors != before);
            }
            int st = 0;
            if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                errors++; fprintf(stderr, "soak: forked child failed (status %#x)\n", st);
            }
            ops[5]++;
        }
        for (size_t pg = 0; pg < s.pages; pg++) verify(&s, pg, "parent after fork");
        attune_tier_stats_t dram;
        if (attune_tier_stats(0, &dram) == 0) {
            if (dram.capacity < budget_min) budget_min = dram.capacity;
            if (dram.capacity > budget_max) budget_max = dram.capacity;
        }
        struct timespec ts = {0, 200 * 1000 * 1000}; nanosleep(&ts, 0);
    }
    drop(&s);
    return NULL;
}

int main(void) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = (int)env_size("SOAK_THREADS", 3 * (ncpu > 0 ? ncpu : 1));
    double secs = (double)env_size("SOAK_SECONDS", 20);
    region_max = env_size("SOAK_REGION_MAX", 8 << 20);
    forks = (int)env_size("SOAK_FORKS", 1) != 0;
    if (nthreads < 1 || nthreads > 256) nthreads = 6;
    common_words = (4 << 20) / 8;
    common = allocate_TM(common_words * 8, ATTUNE_BW);
    CHECK(common != NULL, "common region: %s", attune_last_error()); if (!common) CHECK_DONE();
    memset(common, 0, common_words * 8);
    pthread_t th[257];
    for (long t = 0; t < nthreads; t++) pthread_create(&th[t], 0, worker, (void *)t);
    pthread_create(&th[nthreads], 0, forker, 0);
    struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
    nanosleep(&ts, 0);
    stop = 1;
    for (long t = 0; t <= nthreads; t++) pthread_join(th[t], 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < common_words; i++) sum += common[i];
    CHECK(sum == common_adds, "common region: %lu adds, words sum to %lu", (unsigned long)common_adds, (unsigned long)sum);
    char buf[16384];
    unsigned long faults = 0, evictions = 0, moved = 0;
    if (attune_stats_json(buf, sizeof buf) > 0) {
        char *f = strstr(buf, "\"engine\""), *p;
        if (f && (p = strstr(f, "\"faults\":"))) faults = strtoul(p + 9, 0, 10);
        if (f && (p = strstr(f, "\"evictions\":"))) evictions = strtoul(p + 12, 0, 10);
        if (f && (p = strstr(f, "\"fetched_bytes\":"))) moved += strtoul(p + 16, 0, 10) / PAGE;
        if (f && (p = strstr(f, "\"evicted_bytes\":"))) moved += strtoul(p + 16, 0, 10) / PAGE;
    }
    CHECK(errors == 0, "%lu errors", (unsigned long)errors);
    CHECK(evictions > 0, "the soak must move pages (no eviction: budget too large?)");
    printf("soak: %d threads for %.0f s: %lu page checks, %lu pages moved between tiers (%lu faults, %lu evictions), "
           "%lu regions under thread and %lu under signal delivery, %lu re-allocations, %lu flag changes, %lu pins, %lu discards, %lu prefetches, %lu forks, budget %lu-%lu MiB, %lu errors\n",
           nthreads, secs, (unsigned long)checks, moved, faults, evictions,
           (unsigned long)regions_by_mode[1], (unsigned long)regions_by_mode[2],
           (unsigned long)ops[0], (unsigned long)ops[1], (unsigned long)ops[2], (unsigned long)ops[3],
           (unsigned long)ops[4], (unsigned long)ops[5], (unsigned long)(budget_min >> 20),
           (unsigned long)(budget_max >> 20), (unsigned long)errors);
    free_TM(common);
    CHECK_DONE();
}
