/* Pages on a memory server that goes away (SIGKILL, or its link cut) while the program
 * holds them: writes a pattern over argv[1] MiB (several times the DRAM budget, so most
 * of it is on the servers), says "ready", waits for a line on stdin (the test kills the
 * server), then reads everything back. A read of a lost page must end the program with
 * SIGBUS, never return other data: "WRONG DATA" and exit 3 if it does.
 * argv[2] = "free-exit": free everything and exit at once instead (the discards of the
 * far pages are still in flight when the process ends). */
#define _GNU_SOURCE
#include <attune.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoull(argv[1], 0, 0) : 48) << 20, words = n / 8;
    uint64_t *a = allocate_TM(n, ATTUNE_CAP);
    if (!a) {
        fprintf(stderr, "allocate_TM: %s\n", attune_last_error());
        return 2;
    }
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    if (argc > 2 && strcmp(argv[2], "free-exit") == 0) {
        free_TM(a);
        return 0;
    }
    printf("remote_lost: ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 2;
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    if (bad) {
        printf("remote_lost: WRONG DATA (%llu words)\n", (unsigned long long)bad);
        return 3;
    }
    printf("remote_lost: read back\n");
    return 0;
}
