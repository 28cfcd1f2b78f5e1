/* fork: the child inherits managed memory (reads the parent's data as it was at the fork;
 * tests/c/fork_inherit.c goes further) and can allocate its own; the parent's data is
 * intact. exec: the child program starts clean. */
#define _GNU_SOURCE
#include <attune.h>
#include <signal.h>
#include <sys/wait.h>
#include <string.h>
#include "check.h"

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "child-exec") == 0) {
        /* After exec: a fresh runtime works. */
        uint64_t *b = allocate_TM(8u << 20, ATTUNE_CAP);
        if (!b) return 3;
        for (size_t i = 0; i < (1u << 20); i++) b[i] = mix64(i);
        for (size_t i = 0; i < (1u << 20); i++) if (b[i] != mix64(i)) return 4;
        free_TM(b);
        return 0;
    }
    size_t n = 32u << 20, words = n / 8;
    uint64_t *a = allocate_TM(n, ATTUNE_BW);
    CHECK(a != NULL, "alloc");
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);

    pid_t p = fork();
    if (p == 0) {
        for (size_t i = 0; i < words; i++) if (a[i] != mix64(i)) _exit(1);
        for (size_t i = 0; i < words; i++) a[i] = 0;   /* its own copy */
        _exit(0);
    }
    int st; waitpid(p, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child reading the memory it inherited: status %#x", st);

    p = fork();
    if (p == 0) {
        uint64_t *c = allocate_TM(24u << 20, 0);
        if (!c) _exit(2);
        for (size_t i = 0; i < (3u << 20); i++) c[i] = mix64(i) ^ 1;
        for (size_t i = 0; i < (3u << 20); i++) if (c[i] != (mix64(i) ^ 1)) _exit(3);
        free_TM(c);
        _exit(0);
    }
    waitpid(p, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child using its own runtime: status %#x", st);

    p = fork();
    if (p == 0) { execl("/proc/self/exe", argv[0], "child-exec", (char *)0); _exit(9); }
    waitpid(p, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exec'd child: status %#x", st);

    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "parent data changed: %lu", bad);
    free_TM(a);
    CHECK_DONE();
}
