/* Signal delivery (ATTUNE_FAULT_MODE=signal) with a program that has its own SIGBUS
 * handling: it installs a handler after the runtime started (sigaction, then signal), and
 * a worker thread blocks every signal. Managed faults still resolve (before, the
 * program's handler got them and the access faulted forever at 100% CPU; a thread with
 * SIGBUS blocked died); a SIGBUS that is not the runtime's (a read past the end of a
 * mapped file) reaches the program's handler; sigaction reports the program's own
 * handler back. Budget: $TEST_BUDGET. */
#define _GNU_SOURCE
#include <attune.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"

static sigjmp_buf jb;
static volatile sig_atomic_t handled;
static void on_bus(int s) { (void)s; handled++; siglongjmp(jb, 1); }
static void on_bus_info(int s, siginfo_t *si, void *c) { (void)si; (void)c; on_bus(s); }

static size_t words;
static uint64_t *a, *b;

/* Writes and checks a, with b's pass in between evicting most of a. */
static uint64_t pass(uint64_t salt) {
    for (size_t i = 0; i < words; i++) a[i] = mix64(i) ^ salt;
    for (size_t i = 0; i < words; i++) b[i] += 1;
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != (mix64(i) ^ salt);
    return bad;
}

static void *blocked_worker(void *arg) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    *(uint64_t *)arg = pass(3);
    return NULL;
}

/* A SIGBUS that is not the runtime's: a read past the end of a file mapping. */
static int foreign_sigbus_reaches_handler(void) {
    char path[] = "/tmp/attune-sigbus-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    unlink(path);
    if (ftruncate(fd, 4096) != 0) { close(fd); return 0; }
    volatile char *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 0;
    int before = handled;
    if (!sigsetjmp(jb, 1)) { char c = m[4096]; (void)c; }
    munmap((void *)m, 8192);
    return handled == before + 1;
}

int main(void) {
    size_t bytes = 32u << 20;
    words = bytes / 8;
    a = allocate_TM(bytes, 0);
    b = allocate_TM(bytes, 0);
    CHECK(a && b, "alloc: %s", attune_last_error());
    if (!a || !b) return 1;
    memset(b, 0, bytes); /* the runtime (and its SIGBUS handler) is running now */

    /* The program's handler, by sigaction: managed faults still resolve. */
    struct sigaction sa = {.sa_sigaction = on_bus_info, .sa_flags = SA_SIGINFO}, old;
    CHECK(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction");
    CHECK(pass(1) == 0, "words wrong with the program's sigaction handler");
    CHECK(handled == 0, "the program's handler saw a managed fault");
    CHECK(sigaction(SIGBUS, NULL, &old) == 0 && old.sa_sigaction == on_bus_info,
          "sigaction does not report the program's own handler");
    CHECK(foreign_sigbus_reaches_handler(), "a SIGBUS that is not the runtime's missed the program's handler");

    /* By signal(): the same. */
    CHECK(signal(SIGBUS, on_bus) == (sighandler_t)on_bus_info, "signal's previous handler");
    CHECK(pass(2) == 0, "words wrong with the program's signal handler");
    CHECK(foreign_sigbus_reaches_handler(), "a foreign SIGBUS missed the handler set by signal()");

    /* A thread that blocks every signal faults on managed memory and lives. */
    uint64_t bad = 1;
    pthread_t t;
    pthread_create(&t, NULL, blocked_worker, &bad);
    pthread_join(t, NULL);
    CHECK(bad == 0, "words wrong in a thread that blocked SIGBUS");
    CHECK(handled == 2, "the program's handler ran %d times, expected 2", (int)handled);

    free_TM(a);
    free_TM(b);
    CHECK_DONE();
}
