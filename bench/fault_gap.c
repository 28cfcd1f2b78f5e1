/* What the fault-handler thread's polling costs a program that faults now and then:
 * write PAGES pages of a managed region (more than the DRAM budget, so the first ones
 * are evicted), then touch each again in order with a busy wait of GAP_US between
 * touches. Prints the wall time per touch and the CPU time beyond the wall time per
 * touch (the handler's and the evictor's share). Run with ATTUNE_READAHEAD=0 and
 * ATTUNE_HANDLER_SPIN_US=0 or 100 (docs/benchmarks-history.md, "The fault-handler thread polls").
 * Build: gcc -O2 bench/fault_gap.c -o fault_gap $(pkg-config --cflags --libs attune) */
#include <attune.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s GAP_US PAGES\n", argv[0]);
        return 2;
    }
    double gap = atof(argv[1]) * 1e-6;
    size_t n = strtoull(argv[2], 0, 10);
    volatile char *p = allocate_TM(n << 12, 0);
    if (!p) {
        perror("allocate_TM");
        return 1;
    }
    for (size_t i = 0; i < n; i++) p[i << 12] = (char)(i | 1);
    double t0 = now(), c0 = cpu_seconds();
    size_t bad = 0;
    volatile unsigned long spin = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i << 12] != (char)(i | 1)) bad++;
        double t = now();
        while (now() - t < gap) spin++;
    }
    double wall = now() - t0, cpu = cpu_seconds() - c0;
    if (bad) {
        printf("fault_gap: FAILED %zu wrong pages\n", bad);
        return 1;
    }
    printf("fault_gap: gap %.0f us, wall per touch %.1f us, extra CPU per touch %.1f us\n",
           gap * 1e6, wall / n * 1e6, (cpu - wall) / n * 1e6);
    free_TM((void *)p);
    return 0;
}
