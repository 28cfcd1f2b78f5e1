/* Reads its whole array back from an atexit handler, after a pause (an unmodified program
 * for `attune run`). The handler is registered before the array is allocated, so under
 * Attune it runs after the runtime's own exit handler, which has told the memory servers
 * that the process is exiting: the far pages must still be served, however long the
 * exit takes. Usage: exit_reads MIB PAUSE_MS [LINGER_MS]. With LINGER_MS, says
 * "exit_reads: written" once the array is written and waits that long before returning
 * from main (a test acts on the servers meanwhile). Prints "exit_reads: OK" from the
 * handler. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t *a;
static size_t words;
static long pause_ms;

static void check(void) {
    struct timespec ts = {pause_ms / 1000, (pause_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    for (size_t i = 0; i < words; i++) {
        if (a[i] != i * 0x9E3779B97F4A7C15ull) {
            printf("exit_reads: FAIL at word %zu\n", i);
            fflush(stdout);
            _Exit(1);
        }
    }
    printf("exit_reads: OK (%zu MiB read back at exit after %ld ms)\n", (words * 8) >> 20, pause_ms);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoull(argv[1], NULL, 0) : 48;
    pause_ms = argc > 2 ? atol(argv[2]) : 0;
    atexit(check);
    words = (mib << 20) / sizeof(uint64_t);
    a = malloc(words * sizeof(uint64_t));
    if (!a) { fprintf(stderr, "exit_reads: cannot allocate %zu MiB\n", mib); return 1; }
    for (size_t i = 0; i < words; i++) a[i] = i * 0x9E3779B97F4A7C15ull;
    if (argc > 3) {
        long linger = atol(argv[3]);
        printf("exit_reads: written\n");
        fflush(stdout);
        struct timespec ts = {linger / 1000, (linger % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return 0;
}
