/* fork: a child that cannot take the runtime over (here: no descriptor left for its
 * userfaultfds, RLIMIT_NOFILE at the parent's highest descriptor) must fail loudly when
 * it touches the managed memory it inherited (SIGSEGV: the ranges are unmapped), never
 * read zeros or stale data, and the parent's memory must be intact afterwards. A child
 * that goes on without touching it can still allocate. */
#define _GNU_SOURCE
#include <attune.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"

int main(void) {
    size_t budget = env_size("TEST_BUDGET", 16u << 20), n = 3 * budget, words = n / 8;
    uint64_t *a = allocate_TM(n, 0);
    CHECK(a != NULL, "alloc: %s", attune_last_error());
    if (!a) CHECK_DONE();
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);   /* two thirds go to the far tier */
    void *small_before = allocate_TM(64, 0);   /* mimalloc's thread state links its arena */
    CHECK(small_before != NULL, "small alloc: %s", attune_last_error());
    /* Descriptors a child can close after the fork (the takeover has failed by then). */
    int spare[12];
    for (int k = 0; k < 12; k++) spare[k] = open("/dev/null", O_RDONLY);
    /* The lowest free descriptor number is the limit: nothing new can be opened. */
    int probe = open("/dev/null", O_RDONLY);
    CHECK(probe >= 0, "open /dev/null");
    close(probe);
    struct rlimit old, low;
    CHECK(getrlimit(RLIMIT_NOFILE, &old) == 0, "getrlimit");
    low = old;
    low.rlim_cur = (rlim_t)probe;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0, "setrlimit");
    pid_t pid = fork();
    if (pid == 0) {
        /* Touch the first and last word: either faults loudly. Reaching the exit is the
         * failure (the memory read as something). */
        volatile uint64_t x = a[0] + a[words - 1];
        (void)x;
        _exit(42);
    }
    /* A second child goes on after the failed takeover: with descriptors free again it
     * starts a runtime of its own; small and large requests work (mimalloc's state from
     * the parent refers to unmapped arenas and must not be used). */
    pid_t pid2 = fork();
    if (pid2 == 0) {
        for (int k = 0; k < 12; k++) close(spare[k]);
        uint64_t *s1 = allocate_TM(64, 0), *l1 = allocate_TM(4u << 20, 0);
        if (!s1 || !l1) _exit(10);
        for (int i = 0; i < 8; i++) s1[i] = mix64(i);
        for (size_t i = 0; i < (4u << 20) / 8; i++) l1[i] = mix64(i);
        for (int i = 0; i < 8; i++) if (s1[i] != mix64(i)) _exit(11);
        for (size_t i = 0; i < (4u << 20) / 8; i++) if (l1[i] != mix64(i)) _exit(12);
        free_TM(s1);
        free_TM(l1);
        _exit(0);
    }
    CHECK(setrlimit(RLIMIT_NOFILE, &old) == 0, "setrlimit back");
    for (int k = 0; k < 12; k++) close(spare[k]);
    int st = 0;
    CHECK(waitpid(pid2, &st, 0) == pid2, "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "a child after a failed takeover allocates small and large blocks: status %#x", st);
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    CHECK(WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS),
          "the child should die of SIGSEGV/SIGBUS touching memory it could not take over: status %#x", st);
    size_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "parent: %zu words wrong after the child", bad);
    /* The parent goes on: a new allocation and a fork that can take over. */
    uint64_t *b = allocate_TM(1 << 20, 0);
    CHECK(b != NULL, "alloc after: %s", attune_last_error());
    if (b) {
        b[0] = 7;
        pid = fork();
        if (pid == 0) _exit(b[0] == 7 && a[words / 2] == mix64(words / 2) ? 0 : 3);
        CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "a later fork's child reads its memory: status %#x", st);
        free_TM(b);
    }
    free_TM(small_before);
    free_TM(a);
    CHECK_DONE();
}
