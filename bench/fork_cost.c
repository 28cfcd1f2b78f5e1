/* The cost of fork for a process holding managed memory (crate::fork: quiesce, child
 * takes the runtime over), beside the same process holding plain malloc'ed memory, in
 * one run. Each round: fork, the child reads one word per page of the whole buffer (so
 * far chunks come back in the child) and exits; the parent waits. Prints medians of
 * fork-to-exit and of the fork call alone.
 *
 * Usage: fork_cost MiB ROUNDS   (budget from ATTUNE_DRAM; plain and managed alternate)
 * Build: gcc -O2 bench/fork_cost.c $(pkg-config --cflags --libs attune) -o fork_cost */
#define _GNU_SOURCE
#include <attune.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One round: returns (fork call, fork to child exit) in seconds. */
static void round_trip(volatile uint64_t *buf, size_t words, double *fork_s, double *total_s) {
    double t0 = now();
    pid_t p = fork();
    if (p == 0) {
        uint64_t s = 0;
        for (size_t i = 0; i < words; i += 512) s += buf[i];
        _exit(s == 0xdeadbeef ? 1 : 0);
    }
    double t1 = now();
    int st; waitpid(p, &st, 0);
    double t2 = now();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child failed: %#x\n", st); exit(1); }
    *fork_s = t1 - t0; *total_s = t2 - t0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], 0, 10) : 256;
    int rounds = argc > 2 ? atoi(argv[2]) : 9;
    size_t n = mib << 20, words = n / 8;
    uint64_t *plain = malloc(n), *managed = allocate_TM(n, ATTUNE_BW);
    if (!plain || !managed) { fprintf(stderr, "allocation failed\n"); return 1; }
    for (size_t i = 0; i < words; i++) plain[i] = managed[i] = i * 0x9E3779B97F4A7C15ull;
    double pf[64], pt[64], mf[64], mt[64];
    if (rounds > 64) rounds = 64;
    for (int r = 0; r < rounds; r++) {
        round_trip(plain, words, &pf[r], &pt[r]);
        round_trip(managed, words, &mf[r], &mt[r]);
    }
    qsort(pf, rounds, sizeof(double), cmp); qsort(pt, rounds, sizeof(double), cmp);
    qsort(mf, rounds, sizeof(double), cmp); qsort(mt, rounds, sizeof(double), cmp);
    int m = rounds / 2;
    printf("fork_cost: %zu MiB, %d rounds, medians (ms)\n", mib, rounds);
    printf("| memory | fork call | fork to child exit (child reads a word per page) |\n|---|---|---|\n");
    printf("| malloc | %.2f | %.2f |\n", pf[m] * 1e3, pt[m] * 1e3);
    printf("| allocate_TM | %.2f | %.2f |\n", mf[m] * 1e3, mt[m] * 1e3);
    printf("ratio fork call %.2f, round trip %.2f\n", mf[m] / pf[m], mt[m] / pt[m]);
    free(plain); free_TM(managed);
    return 0;
}
