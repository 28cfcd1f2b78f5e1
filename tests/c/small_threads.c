/* Small allocations from many short-lived threads. Each thread finds its fork-gate slot by
 * its thread pointer, which must be forgotten when the thread exits:
 * 40 waves of 8 threads (more thread lifetimes than the gate has slots, and new threads
 * at the addresses of dead ones) allocate blocks of every class, check that each lands
 * in its class's arena, keep their data, free half themselves and hand the rest to the
 * main thread, which checks and frees them after the thread is gone (a free from another
 * thread than the one that allocated). */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <string.h>
#include "check.h"

enum { WAVES = 40, THREADS = 8, BLOCKS = 120 };
static const int classes[] = {0, ATTUNE_LAT, ATTUNE_BW, ATTUNE_CAP, ATTUNE_SHL};
enum { NCLASS = sizeof classes / sizeof classes[0] };

struct block { unsigned char *p; size_t size; unsigned char fill; };
struct work { int id; int failures; struct block kept[BLOCKS]; int nkept; };

static int verify(const struct block *b) {
    for (size_t k = 0; k < b->size; k++)
        if (b->p[k] != b->fill) return 0;
    return 1;
}

static void *worker(void *arg) {
    struct work *w = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 1);
    struct block mine[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        int flags = classes[(w->id + i) % NCLASS];
        /* 16 B to 2 KiB: both sides of mimalloc's small-size path (1 KiB). */
        size_t size = 16 + x % 2032;
        unsigned char *p = allocate_TM(size, flags);
        if (!p) { w->failures++; fprintf(stderr, "alloc: %s\n", attune_last_error()); return NULL; }
        attune_region_stats_t s;
        if (attune_region_stats(p, &s) != 0 || s.flags != (uint32_t)flags) {
            w->failures++;
            fprintf(stderr, "thread %d block %d of class %#x is in the arena of class %#x\n",
                    w->id, i, flags, s.flags);
        }
        mine[i] = (struct block){p, size, (unsigned char)(w->id * 31 + i)};
        memset(p, mine[i].fill, size);
    }
    for (int i = 0; i < BLOCKS; i++) {
        if (!verify(&mine[i])) { w->failures++; fprintf(stderr, "thread %d block %d corrupted\n", w->id, i); }
        if (i % 2) w->kept[w->nkept++] = mine[i];
        else if (attune_free(mine[i].p) != 0) { w->failures++; fprintf(stderr, "free: %s\n", attune_last_error()); }
    }
    return NULL;
}

int main(void) {
    static struct work w[THREADS];
    long lifetimes = 0;
    for (int wave = 0; wave < WAVES; wave++) {
        pthread_t t[THREADS];
        for (int i = 0; i < THREADS; i++) {
            w[i] = (struct work){.id = wave * THREADS + i};
            CHECK(pthread_create(&t[i], NULL, worker, &w[i]) == 0, "pthread_create");
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < THREADS; i++) {
            lifetimes++;
            CHECK(w[i].failures == 0, "thread %d: %d failures", w[i].id, w[i].failures);
            for (int k = 0; k < w[i].nkept; k++) {
                CHECK(verify(&w[i].kept[k]), "block %d of dead thread %d corrupted", k, w[i].id);
                CHECK(attune_free(w[i].kept[k].p) == 0, "free of a dead thread's block: %s", attune_last_error());
            }
        }
    }
    /* The main thread's own theaps still work after all that. */
    for (int c = 0; c < NCLASS; c++) {
        unsigned char *p = allocate_TM(100, classes[c]);
        attune_region_stats_t s;
        CHECK(p && attune_region_stats(p, &s) == 0 && s.flags == (uint32_t)classes[c], "main thread, class %#x", classes[c]);
        if (p) { memset(p, 5, 100); CHECK(attune_free(p) == 0, "main thread free"); }
    }
    printf("small-threads: %ld thread lifetimes, %d blocks each\n", lifetimes, BLOCKS);
    CHECK_DONE();
}
