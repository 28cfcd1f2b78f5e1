/* Allocates MIB MiB (malloc), says "ready", waits for a line on stdin, then fills the
 * array and checks every word: a fill that starts when a test has set the stage (the
 * node daemon stopped, a tier full). Usage: fill_on_cue MIB */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 64;
    size_t words = (mib << 20) / sizeof(uint64_t);
    uint64_t *a = malloc(words * sizeof(uint64_t));
    if (!a) { fprintf(stderr, "fill_on_cue: cannot allocate %zu MiB\n", mib); return 1; }
    printf("fill_on_cue: ready\n");
    fflush(stdout);
    char c;
    if (read(0, &c, 1) != 1) { fprintf(stderr, "fill_on_cue: no cue\n"); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < words; i++)
        if (a[i] != i * 0x9E3779B97F4A7C15ull) { printf("fill_on_cue: FAIL at word %zu\n", i); return 1; }
    printf("fill_on_cue: OK (%zu MiB)\n", mib);
    return 0;
}
