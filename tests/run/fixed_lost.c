/* MAP_FIXED of a file over managed memory whose far copy is lost, and a commit in place
 * that is not made of whole chunks, under `attune run`. Each one must keep the kernel's
 * meaning and lose nothing that was not already lost:
 *   1. a commit that is not whole chunks (run with --chunk 64K: MIB*1M + 16 KiB) is left
 *      to the kernel: plain memory that reads zero, then holds what is written;
 *   2. two commits A and B of MIB MiB each, filled in turn, so that A leaves DRAM; then the
 *      tier file is cut behind the runtime's back (as lost_tier.c does);
 *   3. a file mapped over A's first 64 KiB: to give A to the kernel the runtime must bring
 *      its pages home, which it cannot, so the mapping is refused (EINVAL) and A stays
 *      mapped and managed; B's resident pages still hold their data;
 *   4. a read of A then ends in SIGBUS: never the file's bytes, never zeros.
 * Steps 2-4 run in a child; the parent checks it died of SIGBUS after step 3.
 * Usage: fixed_lost TIER_DIR MIB (TIER_DIR: the directory of the only far tier, a file). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../c/tier_file.h"

#define FAIL(code, ...) do { printf("fixed_lost: FAIL: " __VA_ARGS__); printf("\n"); fflush(stdout); _exit(code); } while (0)
#define RW (PROT_READ | PROT_WRITE)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)
#define ALIGN (2u << 20)

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9e3779b97f4a7c15ull; return x ^ (x >> 29); }

/* A reservation of len bytes (PROT_NONE) starting on a 2 MiB boundary, so that commits at
 * its start are whole chunks of any size up to 2 MiB. */
static char *reserve(size_t len) {
    char *p = mmap(NULL, len + ALIGN, PROT_NONE, ANON | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    return (char *)(((uintptr_t)p + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1));
}

static int commit(char *at, size_t len) { return mmap(at, len, RW, ANON | MAP_FIXED, -1, 0) == (void *)at; }

static void fill(uint64_t *w, size_t n, uint64_t salt) { for (size_t i = 0; i < n; i++) w[i] = mix(i) ^ salt; }
static size_t bad(const uint64_t *w, size_t lo, size_t hi, uint64_t salt) {
    size_t n = 0;
    for (size_t i = lo; i < hi; i++) n += w[i] != (mix(i) ^ salt);
    return n;
}

static void lose_and_refuse(const char *dir, size_t m) {
    alarm(60);   /* a fault replayed forever ends as SIGALRM: a failure */
    char *heap = reserve(2 * m);
    if (!heap) FAIL(3, "reserve: %m");
    uint64_t *a = (uint64_t *)heap, *b = (uint64_t *)(heap + m);
    size_t words = m / 8;
    if (!commit(heap, m) || !commit(heap + m, m)) FAIL(3, "commit: %m");
    fill(a, words, 1);
    fill(b, words, 2);
    int fd = tier_fd(dir);
    if (fd < 0) FAIL(4, "no tier file in %s (was A evicted to it?)", dir);
    size_t tail = (1u << 20) / 8;   /* B's last MiB: written last, resident */
    if (bad(b, words - tail, words, 2)) FAIL(5, "B's last MiB before the cut");
    if (ftruncate(fd, 0) != 0) FAIL(6, "ftruncate the tier file: %m");
    /* A file over A's first 64 KiB. */
    char path[4096];
    snprintf(path, sizeof path, "%s/fixed_lost.XXXXXX", dir);
    int ff = mkstemp(path);
    if (ff < 0) FAIL(7, "mkstemp %s: %m", path);
    unlink(path);
    uint64_t v = 0x66696c65;   /* "file" */
    for (size_t i = 0; i < (64u << 10) / 8; i++)
        if (write(ff, &v, 8) != 8) FAIL(7, "write: %m");
    errno = 0;
    void *r = mmap(heap, 64u << 10, RW, MAP_PRIVATE | MAP_FIXED, ff, 0);
    if (r != MAP_FAILED) FAIL(8, "a file was mapped over a region whose pages were lost (it must be refused)");
    if (errno != EINVAL) FAIL(8, "MAP_FIXED over lost pages failed with %m, not EINVAL");
    close(ff);
    if (bad(b, words - tail, words, 2)) FAIL(9, "B's last MiB after the refusal");
    printf("fixed_lost: refused (EINVAL), B kept\n");
    fflush(stdout);
    volatile uint64_t x = a[0];   /* lost with the tier file: SIGBUS */
    FAIL(x == v ? 10 : x == 0 ? 11 : 12, "read a lost page as %#llx (expected SIGBUS)", (unsigned long long)x);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: fixed_lost TIER_DIR MIB\n"); return 2; }
    size_t m = strtoul(argv[2], NULL, 10) << 20;
    /* 1. a commit that is not whole 64 KiB chunks: the kernel's */
    size_t odd = m + (16u << 10), ow = odd / 8;
    char *h = reserve(odd);
    if (!h || !commit(h, odd)) FAIL(1, "odd commit: %m");
    uint64_t *o = (uint64_t *)h;
    for (size_t i = 0; i < ow; i++) if (o[i]) FAIL(1, "the odd commit's word %zu is not zero", i);
    fill(o, ow, 3);
    if (bad(o, 0, ow, 3)) FAIL(1, "the odd commit lost words");
    munmap(h, odd);
    /* 2-4 in a child */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) FAIL(1, "fork: %m");
    if (pid == 0) lose_and_refuse(argv[1], m);
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) FAIL(1, "waitpid: %m");
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGBUS)
        FAIL(1, "the child should die of SIGBUS after the refusal: %s %d", WIFSIGNALED(st) ? "signal" : "exit",
             WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    printf("fixed_lost: OK\n");
    return 0;
}
