/* A heap reserved PROT_NONE and committed in place with MAP_FIXED, as the JVM's (and other
 * runtimes') heaps are: under `attune run` the committed parts are tiered, and every
 * replacement keeps the kernel's meaning. Steps, each checked word by word:
 *   1. reserve MIB*2 (PROT_NONE, MAP_NORESERVE); commit MIB (MAP_FIXED, read-write), fill;
 *      an expansion commits MIB/4 more, filled;
 *   2. the whole committed heap is written: the process's RSS stays under MAX_RSS_MIB
 *      (without Attune, or with the commits left to the kernel, it holds all of it);
 *   3. decommit a quarter (MAP_FIXED, PROT_NONE): a read of it faults (SIGSEGV); its
 *      neighbours keep their data;
 *   4. commit half of that quarter again: it reads zero, is written and read back;
 *   5. map a file over the first part of a 1 MiB commit (as the JVM maps its archived heap
 *      over a committed region) after the rest of the heap pushed the commit out of DRAM:
 *      the file's bytes show there, the rest of the commit keeps its data;
 *   6. a commit partly unmapped, then fresh memory MAP_FIXED over its other part: refused
 *      (EINVAL, which bytes of it the program still holds is not known to Attune), and
 *      that part keeps its data;
 *   7. unmap the reservation.
 * Usage: fixed_commit DIR MIB MAX_RSS_MIB (DIR: where the step-5 file goes). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAIL(...) do { printf("fixed_commit: FAIL: " __VA_ARGS__); printf("\n"); return 1; } while (0)
#define RW (PROT_READ | PROT_WRITE)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static sigjmp_buf jb;
static void on_segv(int s) { (void)s; siglongjmp(jb, 1); }
static int faults_on_read(volatile uint64_t *p) {
    if (sigsetjmp(jb, 1)) return 1;
    uint64_t v = *p; (void)v;
    return 0;
}

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9e3779b97f4a7c15ull; return x ^ (x >> 29); }

static long rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256]; long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) v = strtol(line + 6, NULL, 10) / 1024;
    if (f) fclose(f);
    return v;
}

static int commit(char *at, size_t len, int prot) {
    int flags = ANON | MAP_FIXED | (prot == PROT_NONE ? MAP_NORESERVE : 0);
    return mmap(at, len, prot, flags, -1, 0) == (void *)at;
}

/* Words of [lo, hi) (word indices) that do not hold mix(i) ^ salt. */
static size_t bad(uint64_t *w, size_t lo, size_t hi, uint64_t salt) {
    size_t n = 0;
    for (size_t i = lo; i < hi; i++) n += w[i] != (mix(i) ^ salt);
    return n;
}
static void fill(uint64_t *w, size_t lo, size_t hi, uint64_t salt) {
    for (size_t i = lo; i < hi; i++) w[i] = mix(i) ^ salt;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: fixed_commit DIR MIB MAX_RSS_MIB\n"); return 2; }
    size_t mib = strtoul(argv[2], NULL, 10), m = mib << 20, q = m / 4;
    long max_rss = strtol(argv[3], NULL, 10);
    struct sigaction sa = {.sa_handler = on_segv};
    sigaction(SIGSEGV, &sa, NULL);
    char *heap = mmap(NULL, 2 * m, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
    if (heap == MAP_FAILED) FAIL("reserve: %m");
    uint64_t *w = (uint64_t *)heap;
    size_t W = m / 8, Q = q / 8;
    /* 1. commit and an expansion */
    if (!commit(heap, m, RW)) FAIL("commit: %m");
    fill(w, 0, W, 1);
    if (!commit(heap + m, q, RW)) FAIL("expansion: %m");
    fill(w, W, W + Q, 2);
    /* 2. the whole heap written again: tiered, RSS bounded */
    size_t n = bad(w, 0, W, 1) + bad(w, W, W + Q, 2);
    if (n) FAIL("after the commits: %zu bad words", n);
    fill(w, 0, W + Q, 3);
    long rss = rss_mib();
    if (bad(w, 0, W + Q, 3)) FAIL("after rewriting: bad words");
    if (rss > max_rss) FAIL("RSS %ld MiB after writing %zu MiB committed in place (at most %ld)", rss, (m + q) >> 20, max_rss);
    /* 3. decommit the third quarter */
    if (!commit(heap + 2 * q, q, PROT_NONE)) FAIL("decommit: %m");
    if (!faults_on_read(&w[2 * Q]) || !faults_on_read(&w[3 * Q - 1])) FAIL("a decommitted page did not fault");
    if (bad(w, 0, 2 * Q, 3) || bad(w, 3 * Q, W + Q, 3)) FAIL("a decommit changed its neighbours");
    /* 4. commit half of it again: zeros, then data */
    if (!commit(heap + 2 * q, q / 2, RW)) FAIL("recommit: %m");
    for (size_t i = 2 * Q; i < 2 * Q + Q / 2; i++) if (w[i]) FAIL("a recommitted word is not zero");
    if (!faults_on_read(&w[2 * Q + Q / 2])) FAIL("the part left decommitted did not fault");
    fill(w, 2 * Q, 2 * Q + Q / 2, 4);
    n = bad(w, 0, 2 * Q, 3) + bad(w, 2 * Q, 2 * Q + Q / 2, 4) + bad(w, 3 * Q, W + Q, 3);
    if (n) FAIL("after the recommit: %zu bad words", n);
    /* 5. a file mapped over the first part of a 1 MiB commit */
    char *one = heap + m + q;
    size_t ow = (1u << 20) / 8, fw = (480u << 10) / 8;
    if (!commit(one, 1u << 20, RW)) FAIL("1 MiB commit: %m");
    uint64_t *o = (uint64_t *)one;
    for (size_t i = 0; i < ow; i++) o[i] = mix(i) ^ 5;
    /* The rest of the heap written again, so that the commit's pages leave DRAM: giving
     * the region back must bring them home first. */
    fill(w, 0, 2 * Q, 7);
    fill(w, 3 * Q, W + Q, 7);
    char path[4096];
    snprintf(path, sizeof path, "%s/fixed_commit.XXXXXX", argv[1]);
    int fd = mkstemp(path);
    if (fd < 0) FAIL("mkstemp %s: %m", path);
    unlink(path);
    for (size_t i = 0; i < fw; i++) { uint64_t v = mix(i) ^ 6; if (write(fd, &v, 8) != 8) FAIL("write: %m"); }
    if (mmap(one, fw * 8, RW, MAP_PRIVATE | MAP_FIXED, fd, 0) != (void *)one) FAIL("file over a commit: %m");
    close(fd);
    for (size_t i = 0; i < fw; i++) if (o[i] != (mix(i) ^ 6)) FAIL("the file's word %zu", i);
    for (size_t i = fw; i < ow; i++) if (o[i] != (mix(i) ^ 5)) FAIL("the commit's word %zu after the file", i);
    n = bad(w, 0, 2 * Q, 7) + bad(w, 2 * Q, 2 * Q + Q / 2, 4) + bad(w, 3 * Q, W + Q, 7);
    if (n) FAIL("after the file: %zu bad words", n);
    /* 6. the refusal over a partly unmapped commit */
    char *two = one + (2u << 20);
    size_t tw = (2u << 20) / 8;
    if (!commit(two, 2u << 20, RW)) FAIL("2 MiB commit: %m");
    uint64_t *t = (uint64_t *)two;
    for (size_t i = 0; i < tw; i++) t[i] = mix(i) ^ 8;
    if (munmap(two + (1u << 20), 1u << 20)) FAIL("munmap half a commit: %m");
    errno = 0;
    if (mmap(two, 1u << 20, RW, ANON | MAP_FIXED, -1, 0) != MAP_FAILED || errno != EINVAL)
        FAIL("MAP_FIXED over a partly unmapped commit was not refused with EINVAL (%m)");
    for (size_t i = 0; i < tw / 2; i++) if (t[i] != (mix(i) ^ 8)) FAIL("the refused range lost word %zu", i);
    /* 7. unmap */
    if (munmap(heap, 2 * m)) FAIL("munmap: %m");
    printf("fixed_commit: OK %zu MiB committed in place, RSS %ld MiB\n", (m + q) >> 20, rss);
    return 0;
}
