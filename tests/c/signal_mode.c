/* fault_mode=signal: integrity under eviction; a system call on a non-resident page
 * fails with EFAULT as documented, and works after attune_pin. Thread mode: system calls
 * on non-resident pages work. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include "check.h"

static void run(int mode) {
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.fault_mode = mode;
    size_t n = 48u << 20, words = n / 8;
    uint64_t *a = attune_alloc(n, &o);
    CHECK(a != NULL, "alloc: %s", attune_last_error());
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "mode %d: %lu bad words", mode, bad);
    /* The first MiB was evicted by the passes above (the budget is 16 MiB). */
    int fd = open("/dev/zero", O_RDONLY);
    ssize_t r = read(fd, a, 4096);
    if (mode == ATTUNE_FAULT_SIGNAL) {
        CHECK(r == -1 && errno == EFAULT, "signal mode: read into a non-resident page: r=%zd errno=%d", r, errno);
        CHECK(attune_pin(a, 4096) == 0, "pin");
        r = read(fd, a, 4096);
        CHECK(r == 4096 && a[0] == 0 && a[511] == 0, "read after pin: r=%zd", r);
        attune_unpin(a, 4096);
    } else {
        CHECK(r == 4096 && a[0] == 0 && a[511] == 0, "thread mode: read into a non-resident page: r=%zd errno=%d", r, errno);
    }
    close(fd);
    for (size_t i = 512; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "mode %d after syscall: %lu bad words", mode, bad);
    attune_free(a);
}
int main(void) {
    run(ATTUNE_FAULT_THREAD);
    run(ATTUNE_FAULT_SIGNAL);
    /* A thread with a small alternate signal stack, as Rust's std and Python's faulthandler
     * give theirs: the faults (and the evictions they do) must not run on it. They did,
     * and overflowed it (SIGSEGV in the eviction path of a Rust program). */
    static char alt[8192];
    stack_t ss = { .ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0 };
    CHECK(sigaltstack(&ss, NULL) == 0, "sigaltstack");
    run(ATTUNE_FAULT_SIGNAL);
    CHECK_DONE();
}
