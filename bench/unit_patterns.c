/* Access patterns for the transfer-unit benchmark (bench/unit.py, issue 28): one array
 * of MiB mebibytes, written once, then read in one pattern. Prints
 *   PATTERN secs=S touched=BYTES sum=X
 * where touched is the 4 KiB pages the pattern read: once per pass for the passes, once
 * per read for random reads (each may need its page). What a pager that moves only what
 * is read and keeps nothing would move; a ratio of bytes fetched to it above 1 is waste.
 *
 *   unit_patterns seq MiB       3 sequential passes
 *   unit_patterns random MiB    MiB*1024 random 8-byte reads
 *   unit_patterns strided MiB   4 passes, each reading one word of every 4th page
 *   unit_patterns threads MiB   4 threads, each 3 sequential passes over its quarter
 *   unit_patterns random-threads MiB
 *                               16 threads sharing the random reads (each its own seed):
 *                               many faults at once, as a tier's concurrency serves them */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t *a;
static size_t words;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

struct part { size_t lo, hi; uint64_t sum; };

/* Random 8-byte reads: `reads` of them from seed `x` (xorshift64). */
static uint64_t random_reads(uint64_t x, size_t reads) {
    uint64_t sum = 0;
    for (size_t k = 0; k < reads; k++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        sum += a[x % words];
    }
    return sum;
}

struct reads { uint64_t seed; size_t n; uint64_t sum; };

static void *reader(void *arg) {
    struct reads *r = arg;
    r->sum = random_reads(r->seed, r->n);
    return NULL;
}

static void *stream(void *arg) {
    struct part *p = arg;
    for (int pass = 0; pass < 3; pass++)
        for (size_t i = p->lo; i < p->hi; i++) p->sum += a[i];
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: unit_patterns seq|random|strided|threads|random-threads MiB\n");
        return 2;
    }
    const char *pat = argv[1];
    size_t bytes = (size_t)atol(argv[2]) << 20, pages = bytes / 4096;
    words = bytes / 8;
    a = malloc(bytes);
    if (!a) return 1;
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    uint64_t sum = 0, touched = 0;
    double t = now_s();
    if (!strcmp(pat, "seq")) {
        for (int pass = 0; pass < 3; pass++)
            for (size_t i = 0; i < words; i++) sum += a[i];
        touched = 3 * bytes;
    } else if (!strcmp(pat, "random")) {
        size_t reads = (bytes >> 20) * 1024;
        sum = random_reads(88172645463325252ull, reads);
        touched = reads * 4096;
    } else if (!strcmp(pat, "random-threads")) {
        enum { T = 16 };
        pthread_t th[T];
        struct reads r[T];
        size_t reads = (bytes >> 20) * 1024 / T;
        for (int k = 0; k < T; k++) {
            r[k] = (struct reads){88172645463325252ull + 0x9E3779B97F4A7C15ull * (k + 1), reads, 0};
            pthread_create(&th[k], NULL, reader, &r[k]);
        }
        for (int k = 0; k < T; k++) {
            pthread_join(th[k], NULL);
            sum += r[k].sum;
        }
        touched = reads * T * 4096;
    } else if (!strcmp(pat, "strided")) {
        for (size_t off = 0; off < 4; off++)
            for (size_t p = off; p < pages; p += 4) sum += a[p * 512];
        touched = bytes;
    } else if (!strcmp(pat, "threads")) {
        pthread_t th[4];
        struct part parts[4];
        for (int k = 0; k < 4; k++) {
            parts[k] = (struct part){words / 4 * k, words / 4 * (k + 1), 0};
            pthread_create(&th[k], NULL, stream, &parts[k]);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            sum += parts[k].sum;
        }
        touched = 3 * bytes;
    } else {
        fprintf(stderr, "unit_patterns: unknown pattern '%s'\n", pat);
        return 2;
    }
    printf("%s secs=%.3f touched=%llu sum=%llu\n", pat, now_s() - t, (unsigned long long)touched,
           (unsigned long long)sum);
    free(a);
    return 0;
}
