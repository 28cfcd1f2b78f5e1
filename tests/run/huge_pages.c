/* Huge pages under `attune run` (docs/design/paging.md, "Huge pages").
 *
 *   huge_pages check MIB WAIT_S MIN_MIB MAX_MIB [pressure|fork|nohuge]
 *     fills a MIB buffer (malloc: managed), waits up to WAIT_S seconds for at least
 *     MIN_MIB of it to be on huge pages (AnonHugePages of its mappings in
 *     /proc/self/smaps), reads it at random and checks every word; fails when more than
 *     MAX_MIB is. With "pressure", then fills a second buffer as large, which the budget
 *     cannot hold beside the first (the first's huge pages are split by the moves out),
 *     and checks both again, word by word. With "fork", the pressure phase runs in a
 *     child and in the parent at once, on huge pages the fork left shared. With
 *     "nohuge", the program says MADV_NOHUGEPAGE for the buffer first.
 *   huge_pages bench MIB WAIT_S ACCESSES [MIN_MIB]
 *     fills the buffer, waits up to WAIT_S for all of it but its end spans (or MIN_MIB) to be on huge
 *     pages (0: no wait), then times ACCESSES dependent
 *     random reads (a pointer chase: every read's address comes from the one before, so
 *     each pays its TLB miss) and prints the time per read.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* KiB of AnonHugePages in the mappings that overlap [p, p + len). */
static long huge_kib(const void *p, size_t len) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) {
        perror("smaps");
        exit(2);
    }
    char line[512];
    int inside = 0;
    long kib = 0;
    uintptr_t lo = (uintptr_t)p, hi = lo + len;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a < hi && b > lo;
        } else if (inside && !strncmp(line, "AnonHugePages:", 14)) {
            kib += atol(line + 14);
        }
    }
    fclose(f);
    return kib;
}

static uint64_t word(uint64_t i, uint64_t seed) { return (i * 0x9E3779B97F4A7C15ull) ^ seed; }

static void fill(uint64_t *a, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) a[i] = word(i, seed);
}

static long check(const uint64_t *a, size_t n, uint64_t seed) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) bad += a[i] != word(i, seed);
    return bad;
}

static long wait_huge(const void *p, size_t len, double wait_s, long min_kib) {
    double t0 = now();
    long kib = huge_kib(p, len);
    while (kib < min_kib && now() - t0 < wait_s) {
        usleep(100000);
        kib = huge_kib(p, len);
    }
    return kib;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: huge_pages check MIB WAIT_S MIN_MIB MAX_MIB [pressure] | bench MIB WAIT_S ACCESSES [MIN_MIB]\n");
        return 2;
    }
    size_t len = (size_t)atol(argv[2]) << 20, n = len / 8;
    double wait_s = atof(argv[3]);
    uint64_t *a = malloc(len);
    if (!a) {
        perror("malloc");
        return 2;
    }
    /* Before the first write: a huge page made before the advice would stay one. */
    if (argc > 6 && !strcmp(argv[6], "nohuge") && madvise(a, len, MADV_NOHUGEPAGE) != 0) {
        perror("madvise");
        return 2;
    }
    fill(a, n, 1);
    if (!strcmp(argv[1], "bench")) {
        long accesses = atol(argv[4]);
        /* A random cycle through the words (Sattolo), written over the pattern. */
        for (size_t i = 0; i < n; i++) a[i] = i;
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = next() % i, t = a[i];
            a[i] = a[j];
            a[j] = t;
        }
        /* All of it but a span at each end (malloc's own mapping need not be aligned), or
         * MIN_MIB when given (Attune aligns its regions: all of it; measuring at the
         * default made the result depend on whether the last spans were collapsed yet). */
        long want = argc > 5 ? atol(argv[5]) << 10 : (long)(len >> 10) - 4096;
        long kib = wait_huge(a, len, wait_s, want);
        uint64_t x = 0;
        double t0 = now();
        for (long k = 0; k < accesses; k++) x = a[x];
        double dt = now() - t0;
        printf("huge_pages bench: %zu MiB, %ld MiB on huge pages, %.2f ns per read (%lu)\n",
               len >> 20, kib >> 10, dt * 1e9 / accesses, (unsigned long)(x & 1));
        return 0;
    }
    long min_kib = atol(argv[4]) << 10, max_kib = argc > 5 ? atol(argv[5]) << 10 : 1L << 40;
    long kib = wait_huge(a, len, wait_s, min_kib);
    if (max_kib < min_kib || min_kib == 0) {
        /* Nothing expected: give the passes their chance while reading all of it at
         * random (a page the access sampler parked comes straight back, so its span is
         * whole again at the next pass), then look again. */
        volatile uint64_t sink = 0;
        for (double t0 = now(); now() - t0 < wait_s;)
            for (int k = 0; k < 100000; k++) sink += a[next() % n];
        kib = huge_kib(a, len);
    }
    uint64_t sum = 0;
    for (size_t k = 0; k < n; k++) sum += a[next() % n];
    long bad = check(a, n, 1);
    printf("huge_pages: %zu MiB buffer, %ld MiB on huge pages, %ld bad words (%lu)\n", len >> 20,
           kib >> 10, bad, (unsigned long)(sum & 1));
    if (bad || kib < min_kib || kib > max_kib) {
        printf("huge_pages: FAIL (wanted %ld-%ld MiB on huge pages)\n", min_kib >> 10, max_kib >> 10);
        return 1;
    }
    int forked = argc > 6 && !strcmp(argv[6], "fork");
    pid_t child = forked ? fork() : -1;
    if (forked && child < 0) {
        perror("fork");
        return 2;
    }
    if (argc > 6 && (forked || !strcmp(argv[6], "pressure"))) {
        uint64_t *b = malloc(len);
        if (!b) {
            perror("malloc");
            return 2;
        }
        fill(b, n, 2);
        long bad_a = check(a, n, 1), bad_b = check(b, n, 2);
        long kib_a = huge_kib(a, len);
        printf("huge_pages: under pressure %ld bad words of the first buffer, %ld of the second; first now %ld MiB on huge pages\n",
               bad_a, bad_b, kib_a >> 10);
        if (bad_a || bad_b) {
            printf("huge_pages: FAIL\n");
            return 1;
        }
        free(b);
    }
    free(a);
    if (child == 0) {
        printf("huge_pages: child OK\n");
        return 0;
    }
    if (child > 0) {
        int st;
        if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("huge_pages: FAIL (child status %d)\n", st);
            return 1;
        }
    }
    printf("huge_pages: OK\n");
    return 0;
}
