/* Windows a remote tier fetched ahead of a stream, made stale by stores (issue 25,
 * docs/design/remote.md "Windows fetched ahead"). argv[1] = MiB of the streamed array
 * (default 32); ATTUNE_DRAM small. Each round reads the array from the start to a
 * point P (the tier fetches windows past P), writes one word in each of the two
 * windows after P, pushes those pages out with random reads of a second array (their
 * stores overlap the windows), then reads on from P: every word
 * must be the one last written, and the test's driver checks that the tier dropped the
 * stale windows rather than finding a mismatch by the content hashes. */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include "check.h"

#define ROUNDS 4
#define CELL (256u << 10) /* the tier's window, COPIED_RUN */

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], 0, 0) : 32;
    size_t n = mib << 20, words = n / 8, ps = 4096;
    size_t budget = env_size("TEST_BUDGET", 8u << 20);
    uint64_t *a = allocate_TM(n, ATTUNE_BW), *b = allocate_TM(n, ATTUNE_BW);
    uint8_t *ver = calloc(words, 1);
    CHECK(a && b && ver, "allocate_TM: %s", attune_last_error());
    if (!a || !b || !ver) CHECK_DONE();
    for (size_t i = 0; i < words; i++) { a[i] = mix64(i); b[i] = mix64(i + words); }
    uint64_t bad = 0, sum = 0, x = 88172645463325252ull;
    for (int r = 0; r < ROUNDS; r++) {
        size_t p = (r + 1) * (n / (ROUNDS + 2)) / ps * ps / 8;
        for (size_t i = 0; i < p; i++) bad += a[i] != mix64(i) + ver[i];
        /* One word in a page of each of the two cells after the one the stream stopped
         * in, where the tier's windows are (not the cells' first or last pages: the
         * fault is a scattered one, placed from inside a window that stays held). */
        size_t cell_end = (p * 8 / CELL + 1) * CELL;
        for (size_t k = 0; k < 2; k++) {
            size_t i = (cell_end + k * CELL + (40u << 10) + r * (12u << 10)) / 8 + 3;
            ver[i]++;
            a[i] = mix64(i) + ver[i];
        }
        for (size_t k = 0; k < 4 * budget / ps; k++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            size_t i = x % words;
            sum += b[i];
            bad += b[i] != mix64(i + words);
        }
        for (size_t i = p; i < words; i++) bad += a[i] != mix64(i) + ver[i];
    }
    CHECK(bad == 0, "%lu words wrong", (unsigned long)bad);
    printf("ahead: %d rounds, %zu MiB, sum %lu\n", ROUNDS, mib, (unsigned long)sum);
    free_TM(a);
    free_TM(b);
    free(ver);
    CHECK_DONE();
}
