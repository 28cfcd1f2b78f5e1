/* Pages on memory servers that go away (SIGKILL, or a cut link) while the program holds
 * them. Writes a pattern over argv[1] MiB (several times the DRAM budget, so most of it
 * is on the servers), says "remote_lost: ready", then follows commands, one a line on
 * stdin: "r" reads everything back ("remote_lost: read back"), "w" writes the next
 * pattern ("remote_lost: written"), "q" exits. A read of a page no server holds any more
 * must end the program with SIGBUS, never return other data: "WRONG DATA" and exit 3.
 * "f" forks: the child goes on following the commands ("remote_lost: forked"), its pages
 * on the sessions the servers cloned for it, and the parent ends as the child ends.
 * argv[2] = "free-exit": free everything and exit at once after writing (the discards
 * of the far pages are still in flight when the process ends). */
#define _GNU_SOURCE
#include <attune.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include "check.h"

int main(int argc, char **argv) {
    size_t n = (argc > 1 ? strtoull(argv[1], 0, 0) : 48) << 20, words = n / 8;
    uint64_t *a = allocate_TM(n, ATTUNE_CAP);
    if (!a) {
        fprintf(stderr, "allocate_TM: %s\n", attune_last_error());
        return 2;
    }
    uint64_t seed = 0;
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    if (argc > 2 && strcmp(argv[2], "free-exit") == 0) {
        free_TM(a);
        return 0;
    }
    printf("remote_lost: ready\n");
    fflush(stdout);
    char line[16];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'r') {
            uint64_t bad = 0;
            for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i + seed);
            if (bad) {
                printf("remote_lost: WRONG DATA (%llu words)\n", (unsigned long long)bad);
                return 3;
            }
            printf("remote_lost: read back\n");
        } else if (line[0] == 'w') {
            seed += words;
            for (size_t i = 0; i < words; i++) a[i] = mix64(i + seed);
            printf("remote_lost: written\n");
        } else if (line[0] == 'f') {
            pid_t c = fork();
            if (c < 0) return 4;
            if (c > 0) {
                int st = 0;
                waitpid(c, &st, 0);
                if (WIFSIGNALED(st)) {
                    signal(WTERMSIG(st), SIG_DFL);
                    raise(WTERMSIG(st));
                }
                return WIFEXITED(st) ? WEXITSTATUS(st) : 5;
            }
            printf("remote_lost: forked\n");
        } else if (line[0] == 'q') {
            break;
        }
        fflush(stdout);
    }
    return 0;
}
