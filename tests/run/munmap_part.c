/* An unmodified program that unmaps part of a large mapping gives that memory back. Under
 * `attune run` with one far tier in memory (its arena counts in this process's RSS) and a
 * budget far below the footprint, most of the part lives in the far tier: the process's
 * RSS must still drop by most of the part's size, and the rest of the mapping keeps its
 * data. A shrinking mremap gives its cut-off tail back the same way.
 * `munmap_part MIB grow MAX_RSS_MIB`: a growing mremap (MREMAP_MAYMOVE) of a managed
 * mapping moves its data into a new managed mapping: the old data is intact, and
 * writing the whole grown mapping keeps RSS under MAX_RSS_MIB (before 2026-11-28 the new
 * mapping was the kernel's, and the old one was unmapped behind the runtime's back). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256]; long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) v = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return v;
}

static int grow(size_t n, long max_rss_kib) {
    size_t words = n / 8, q = n / 4;
    uint64_t *c = mmap(NULL, q, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (c == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < q / 8; i++) c[i] = i ^ 0x5555;
    uint64_t *d = mremap(c, q, n, MREMAP_MAYMOVE);
    if (d == MAP_FAILED) { perror("mremap"); return 4; }
    size_t changed = 0;
    for (size_t i = 0; i < q / 8; i++) changed += d[i] != (i ^ 0x5555);
    for (size_t i = q / 8; i < words; i++) d[i] = i ^ 0x5555;
    long peak = 0;
    for (size_t i = 0; i < words; i++) {
        changed += d[i] != (i ^ 0x5555);
        if (i % (words / 16) == 0) { long r = rss_kib(); if (r > peak) peak = r; }
    }
    if (munmap(d, n) != 0) { perror("munmap"); return 3; }
    if (changed || peak > max_rss_kib) {
        printf("munmap_part: FAIL after mremap growth: %zu words changed, RSS up to %ld KiB (at most %ld)\n",
               changed, peak, max_rss_kib);
        return 1;
    }
    printf("munmap_part: OK grown by mremap, RSS up to %ld KiB\n", peak);
    return 0;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 128, n = mib << 20, words = n / 8;
    if (argc > 3 && strcmp(argv[2], "grow") == 0) return grow(n, atol(argv[3]) << 10);
    uint64_t *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull | 1;
    long before = rss_kib();
    size_t part = n / 2;                                   /* the second and third quarters */
    if (munmap((char *)a + n / 4, part) != 0) { perror("munmap"); return 3; }
    long after = rss_kib();
    size_t changed = 0;
    for (size_t i = 0; i < words / 4; i++) changed += a[i] != (i * 0x9E3779B97F4A7C15ull | 1);
    for (size_t i = 3 * words / 4; i < words; i++) changed += a[i] != (i * 0x9E3779B97F4A7C15ull | 1);
    long freed = before - after, want = (long)(part >> 10) * 3 / 4;
    if (changed || freed < want) {
        printf("munmap_part: FAIL RSS %ld -> %ld KiB (freed %ld, want >= %ld), %zu words changed\n",
               before, after, freed, want, changed);
        return 1;
    }
    /* A shrinking mremap gives the cut-off tail back the same way. */
    munmap(a, n / 4);
    munmap((char *)a + 3 * n / 4, n / 4);
    uint64_t *b = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < words; i++) b[i] = ~i;
    long before2 = rss_kib();
    if (mremap(b, n, n / 4, 0) != b) { perror("mremap"); return 4; }
    long after2 = rss_kib();
    for (size_t i = 0; i < words / 4; i++) changed += b[i] != ~i;
    long freed2 = before2 - after2, want2 = (long)(n >> 10) / 2;
    if (changed || freed2 < want2) {
        printf("munmap_part: FAIL after mremap shrink RSS %ld -> %ld KiB (freed %ld, want >= %ld), %zu words changed\n",
               before2, after2, freed2, want2, changed);
        return 1;
    }
    printf("munmap_part: OK RSS %ld -> %ld KiB (munmap), %ld -> %ld KiB (mremap)\n", before, after, before2, after2);
    return 0;
}
