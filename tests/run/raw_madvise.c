/* A program that gives memory back with the madvise system call itself, not libc's
 * wrapper, and relies on reading zeros there afterwards: Go's scavenger does so, and Go
 * 1.26 then hands the memory out as already zeroed. The interposer cannot see such a
 * call; the kernel reports it to the runtime (docs/design/run.md, "Discards the
 * interposer does not see"). Before, a chunk held in a far tier came back with its old
 * content, and Go's collector found stale pointers ("found bad pointer in Go heap").
 *
 * argv[1] = MiB per thread (default 16), argv[2] = threads (default 4), argv[3] = rounds
 * (default 3), argv[4] = "free" to advise MADV_FREE instead (either content is allowed
 * then, so only the untouched words are checked). Under `attune run --dram` a fraction
 * of the footprint, most of each advised range is far when the advice comes. Each
 * thread, each round: writes its slice, advises whole 64 KiB blocks, single pages and
 * ranges that start and end inside a 64 KiB block (far and just written), rewrites one
 * discarded block, then checks every word: zero where advised, the round's pattern
 * elsewhere. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static size_t slice;
static int rounds, use_free;
static volatile size_t failures;

static uint64_t pat(size_t i, int t, int r) { return ((i * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)t << 48) ^ ((uint64_t)r << 40)) | 1; }

static int raw_madvise(void *p, size_t n) {
    return (int)syscall(SYS_madvise, p, n, use_free ? MADV_FREE : MADV_DONTNEED);
}

/* The advised ranges of a slice, as byte offsets [lo, hi), page-aligned. */
struct range { size_t lo, hi; };
static size_t ranges(struct range *out, size_t len) {
    size_t k = 0, blk = 64 << 10, pg = 4096;
    out[k++] = (struct range){len / 8, len / 8 + 16 * blk};            /* whole blocks, far */
    out[k++] = (struct range){len / 4 + 3 * pg, len / 4 + 4 * pg};      /* one page */
    out[k++] = (struct range){len / 2 + 2 * pg, len / 2 + blk + 3 * pg}; /* across a block edge */
    out[k++] = (struct range){len - 8 * blk + pg, len - 2 * blk - pg};  /* just written */
    return k;
}

static void *run(void *arg) {
    int t = (int)(intptr_t)arg;
    uint64_t *a = mmap(NULL, slice, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); exit(2); }
    size_t words = slice / 8;
    struct range rg[8];
    size_t nr = ranges(rg, slice);
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < words; i++) a[i] = pat(i, t, r);
        for (size_t k = 0; k < nr; k++) {
            if (raw_madvise((char *)a + rg[k].lo, rg[k].hi - rg[k].lo) != 0) { perror("madvise"); exit(3); }
        }
        /* A discarded block written again keeps what is written (it is Fresh, not lost). */
        size_t w0 = rg[0].lo / 8, w1 = w0 + (64 << 10) / 8;
        for (size_t i = w0; i < w1; i++) a[i] = pat(i, t, r);
        size_t bad = 0, stale = 0;
        for (size_t i = 0; i < words; i++) {
            size_t off = i * 8;
            int advised = 0;
            for (size_t k = 0; k < nr; k++) advised |= off >= rg[k].lo && off < rg[k].hi;
            if (i >= w0 && i < w1) advised = 0;
            if (advised) {
                if (use_free) continue;
                if (a[i] != 0) { stale += a[i] == pat(i, t, r); bad++; }
            } else if (a[i] != pat(i, t, r)) {
                bad++;
            }
        }
        if (bad) {
            printf("raw_madvise: FAIL thread %d round %d: %zu words wrong, %zu of them the old content\n", t, r, bad, stale);
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
        }
    }
    munmap(a, slice);
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 16;
    int threads = argc > 2 ? atoi(argv[2]) : 4;
    rounds = argc > 3 ? atoi(argv[3]) : 3;
    use_free = argc > 4 && strcmp(argv[4], "free") == 0;
    slice = mib << 20;
    if (slice < (2u << 20) || threads < 1 || threads > 64 || rounds < 1) {
        fprintf(stderr, "usage: raw_madvise [MiB per thread >= 2] [threads 1-64] [rounds] [free]\n");
        return 2;
    }
    pthread_t th[64];
    for (int t = 0; t < threads; t++) pthread_create(&th[t], 0, run, (void *)(intptr_t)t);
    for (int t = 0; t < threads; t++) pthread_join(th[t], 0);
    if (failures) return 1;
    printf("raw_madvise: OK %d threads x %zu MiB x %d rounds (%s)\n", threads, mib, rounds, use_free ? "MADV_FREE" : "MADV_DONTNEED");
    return 0;
}
