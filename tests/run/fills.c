/* Chunks of one repeated word (an `attune run` test, docs/design/paging.md "Filled
 * chunks"): arrays of 1.0, of zeros written over data, of one int per MiB, next to
 * random data, all over a budget far below them. Checks every word after the pressure,
 * then changes one word in every fourth page of the filled arrays (a fill that becomes
 * data), presses again and checks again; a forked child checks the same from its copy.
 * Usage: fills MIB (each of the four arrays). Prints "fills: OK". */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static size_t n; /* words per array */
static double *ones;
static uint64_t *zeros, *ints, *rnd;

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }
static uint64_t int_word(size_t i) { uint64_t v = (uint32_t)(i / (1 << 17)) + 7; return v | v << 32; }
static int touched(size_t i, int round) { return round > 0 && i % 2048 == 5; }

static long check(int round) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double want = touched(i, round) ? 2.5 : 1.0;
        bad += ones[i] != want;
        bad += zeros[i] != (touched(i, round) ? mix(i) : 0);
        bad += ints[i] != (touched(i, round) ? ~int_word(i) : int_word(i));
        bad += rnd[i] != mix(i ^ 0xabcdef);
    }
    return bad;
}

/* Touches a 3x larger buffer than the arrays so that they go out of DRAM. */
static void press(size_t mib) {
    size_t len = (3 * mib) << 20;
    volatile char *p = malloc(len);
    for (size_t i = 0; i < len; i += 4096) p[i] = (char)i;
    free((void *)p);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 32;
    n = (mib << 20) / 8;
    ones = malloc(n * 8); zeros = malloc(n * 8); ints = malloc(n * 8); rnd = malloc(n * 8);
    if (!ones || !zeros || !ints || !rnd) { puts("fills: cannot allocate"); return 2; }
    for (size_t i = 0; i < n; i++) {
        ones[i] = 1.0;
        zeros[i] = mix(i) | 1; /* data first, then zeros over it */
        ints[i] = int_word(i);
        rnd[i] = mix(i ^ 0xabcdef);
    }
    memset(zeros, 0, n * 8);
    press(mib);
    long bad = check(0);
    if (bad) { printf("fills: FAIL %ld words wrong after the first pressure\n", bad); return 1; }
    for (size_t i = 0; i < n; i++)
        if (touched(i, 1)) { ones[i] = 2.5; zeros[i] = mix(i); ints[i] = ~int_word(i); }
    press(mib);
    bad = check(1);
    if (bad) { printf("fills: FAIL %ld words wrong after the change\n", bad); return 1; }
    pid_t pid = fork();
    if (pid == 0) {
        press(mib);
        _exit(check(1) ? 3 : 0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("fills: FAIL in the child (status %d)\n", st); return 1; }
    if (check(1)) { puts("fills: FAIL after the fork"); return 1; }
    printf("fills: OK %zu MiB each of ones, zeros, ints and random data\n", mib);
    return 0;
}
