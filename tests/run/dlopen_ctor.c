/* A library whose constructor maps and fills memory, loaded with dlopen under `attune run`
 * while another thread keeps the budget full: the shape of numpy's import, where
 * OpenBLAS's constructor maps its buffers inside dlopen. The loader holds its lock through
 * the constructor, so a runtime thread that waits for that lock (a lazily resolved symbol
 * in its I/O path) while the constructor waits for the runtime hangs both. That hang was
 * real: docs/design/run.md, "The runtime never waits for the loader".
 *
 *   dlopen_ctor LIB ROUNDS   loads and unloads LIB (built from this file with -DCTOR_LIB)
 *                            ROUNDS times; the constructor maps 16 buffers of 2 MiB and
 *                            writes each one; every buffer's contents are checked after
 *                            each load. Prints "dlopen_ctor: OK ROUNDS" when all match.
 * Run it under a budget smaller than what the constructor writes, so each load evicts. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NBUF 16
#define BUF (2u << 20)

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#ifdef CTOR_LIB
static uint64_t *bufs[NBUF];
static uint64_t seed;

/* Maps and fills inside the loader's lock: each mmap is a new region of the runtime, each
 * write past the budget an eviction. */
__attribute__((constructor)) static void fill(void) {
    seed = mix((uint64_t)(uintptr_t)&seed);
    for (int b = 0; b < NBUF; b++) {
        bufs[b] = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (bufs[b] == MAP_FAILED) {
            bufs[b] = NULL;
            continue;
        }
        for (size_t i = 0; i < BUF / 8; i++) bufs[b][i] = mix(seed + b * (BUF / 8) + i);
    }
}

__attribute__((destructor)) static void drop(void) {
    for (int b = 0; b < NBUF; b++)
        if (bufs[b]) munmap(bufs[b], BUF);
}

/* The words that do not hold what the constructor wrote (-1: a buffer was not mapped). */
long ctor_check(void) {
    long bad = 0;
    for (int b = 0; b < NBUF; b++) {
        if (!bufs[b]) return -1;
        for (size_t i = 0; i < BUF / 8; i++) bad += bufs[b][i] != mix(seed + b * (BUF / 8) + i);
    }
    return bad;
}
#else
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

static atomic_int done;

/* Keeps the budget full while the main thread loads: evictions run beside every load. */
static void *churn(void *arg) {
    size_t len = 24u << 20;
    uint64_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return (void *)1;
    uint64_t bad = 0;
    for (size_t i = 0; i < len / 8; i++) p[i] = mix(i);
    while (!atomic_load(&done))
        for (size_t i = 0; i < len / 8; i += 512) bad += p[i] != mix(i);
    munmap(p, len);
    return (void *)(uintptr_t)(bad != 0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: dlopen_ctor LIB ROUNDS\n");
        return 2;
    }
    int rounds = atoi(argv[2]);
    pthread_t th;
    if (pthread_create(&th, NULL, churn, NULL)) return 2;
    long bad = 0;
    for (int r = 0; r < rounds; r++) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen_ctor: %s\n", dlerror());
            return 1;
        }
        long (*check)(void) = (long (*)(void))dlsym(h, "ctor_check");
        long b = check ? check() : -1;
        if (b) fprintf(stderr, "dlopen_ctor: round %d: %ld words wrong\n", r, b);
        bad += b != 0;
        dlclose(h);
    }
    atomic_store(&done, 1);
    void *churn_bad;
    pthread_join(th, &churn_bad);
    if (churn_bad) fprintf(stderr, "dlopen_ctor: the churning thread read wrong data\n");
    if (bad || churn_bad) return 1;
    printf("dlopen_ctor: OK %d\n", rounds);
    return 0;
}
#endif
