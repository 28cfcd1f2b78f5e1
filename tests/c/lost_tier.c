/* A tier that loses data: the file tier's file is truncated behind the runtime's back (as
 * an administrator's cleanup or a failing file system would), then the application reads
 * a page whose only copy was there. The access must fail loudly with SIGBUS, in both
 * fault deliveries: never read zeros, never hang replaying the fault. Pages that were
 * resident keep their data. An eviction still in flight when the file is cut writes past
 * the cut, so the lost page then reads from a hole (zeros, no read error): the runtime's
 * content checksum catches that case. Run with a configuration whose only far tier is a file tier
 * in TIER_DIR. */
#define _GNU_SOURCE
#include <attune.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "tier_file.h"

int main(void) {
    const char *dir = getenv("TIER_DIR");
    if (!dir) { fprintf(stderr, "set TIER_DIR to the file tier's directory\n"); return 2; }
    size_t budget = env_size("TEST_BUDGET", 16u << 20), n = 3 * budget, words = n / 8;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);   /* a fault replayed forever ends as SIGALRM: the failure */
        uint64_t *a = allocate_TM(n, 0);
        if (!a) { fprintf(stderr, "alloc: %s\n", attune_last_error()); _exit(3); }
        for (size_t i = 0; i < words; i++) a[i] = mix64(i);   /* the start goes to the file */
        int fd = tier_fd(dir);
        if (fd < 0) { fprintf(stderr, "no tier file in %s\n", dir); _exit(4); }
        if (a[words - 1] != mix64(words - 1)) _exit(5);   /* resident: still right */
        /* The first page that is not resident: its only copy is in the file. */
        size_t lost = 0, ps = (size_t)sysconf(_SC_PAGESIZE);
        while (lost < n / 2 && resident_bytes((char *)a + lost, ps)) lost += ps;
        if (lost >= n / 2) { fprintf(stderr, "nothing was evicted\n"); _exit(9); }
        /* LOST_PUNCH: a hole punched over the data instead (the read succeeds with
         * zeros; only the content checksum can tell). */
        int cut = getenv("LOST_PUNCH")
            ? fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, (off_t)n)
            : ftruncate(fd, 0);
        if (cut != 0) _exit(6);
        volatile uint64_t x = a[lost / 8];                   /* its only copy is gone */
        fprintf(stderr, "read a lost page as %#llx (expected SIGBUS)\n", (unsigned long long)x);
        _exit(x == 0 ? 7 : 8);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGBUS,
          "the access to a lost page should end in SIGBUS: %s %d",
          WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
    CHECK_DONE();
}
