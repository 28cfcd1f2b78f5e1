/* fault_mode=signal: integrity under eviction; a system call on a non-resident page
 * works in both deliveries (under signal delivery, and for an unprivileged user's
 * user-mode-only userfaultfd, libattune's read holds the page and calls again), and
 * after attune_pin as before. Who evicts: a thread resolving its own faults (signal)
 * evicts for itself and leaves the background evictor asleep; a handler thread (thread)
 * leaves most evictions to the evictor, which keeps the headroom. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include "check.h"
#include "engine_stats.h"

/* A 48 MiB region (three times the test budget) whose faults are delivered by `mode`. */
static uint64_t *alloc_in_mode(int mode) {
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.fault_mode = mode;
    uint64_t *a = attune_alloc(48u << 20, &o);
    CHECK(a != NULL, "alloc: %s", attune_last_error());
    return a;
}

static void run(int mode) {
    size_t words = (48u << 20) / 8;
    uint64_t *a = alloc_in_mode(mode);
    if (!a) return;
    for (size_t i = 0; i < words; i++) a[i] = mix64(i);
    uint64_t bad = 0;
    for (size_t i = 0; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "mode %d: %lu bad words", mode, bad);
    /* The first MiB was evicted by the passes above (the budget is 16 MiB). */
    int fd = open("/dev/zero", O_RDONLY);
    ssize_t r = read(fd, a, 4096);
    /* Signal delivery (and a user-mode-only userfaultfd in either) cannot fault the page
     * in for the kernel: libattune's read holds it in DRAM and calls again. */
    CHECK(r == 4096 && a[0] == 0 && a[511] == 0, "mode %d: read into a non-resident page: r=%zd errno=%d", mode, r, errno);
    /* Pinning around I/O still works, as before. */
    for (size_t i = 512; i < words; i++) bad += a[i] != mix64(i); /* evicts the first page again */
    CHECK(attune_pin(a, 4096) == 0, "pin");
    r = read(fd, a, 4096);
    CHECK(r == 4096 && a[0] == 0 && a[511] == 0, "read after pin: r=%zd", r);
    attune_unpin(a, 4096);
    close(fd);
    for (size_t i = 512; i < words; i++) bad += a[i] != mix64(i);
    CHECK(bad == 0, "mode %d after syscall: %lu bad words", mode, bad);
    attune_free(a);
}
/* Random updates over a region three times the budget; returns the evictor's share of
 * the bytes evicted meanwhile. */
static double evictor_share(int mode) {
    size_t words = (48u << 20) / 8;
    uint64_t *a = alloc_in_mode(mode);
    if (!a) return -1;
    for (size_t i = 0; i < words; i++) a[i] = i;
    uint64_t ev0 = engine_counter("evicted_bytes"), bg0 = engine_counter("evictor_evicted_bytes");
    uint64_t dr0 = engine_counter("direct_reclaims");
    CHECK(ev0 != UINT64_MAX && bg0 != UINT64_MAX && dr0 != UINT64_MAX, "engine counters in attune_stats_json");
    uint64_t x = 88172645463325252ull;
    enum { UPDATES = 40000 };
    for (int k = 0; k < UPDATES; k++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; a[x % words] += 1; }
    uint64_t ev = engine_counter("evicted_bytes") - ev0, bg = engine_counter("evictor_evicted_bytes") - bg0;
    uint64_t dr = engine_counter("direct_reclaims") - dr0;
    uint64_t gained = 0;
    for (size_t i = 0; i < words; i++) gained += a[i] - i;
    CHECK(gained == UPDATES, "mode %d: %llu updates found of %d", mode, (unsigned long long)gained, UPDATES);
    CHECK(ev > 0, "mode %d: the updates evicted nothing", mode);
    printf("mode %d: evicted %llu bytes, the evictor %llu of them; %llu direct reclaims\n", mode,
           (unsigned long long)ev, (unsigned long long)bg, (unsigned long long)dr);
    if (mode == ATTUNE_FAULT_SIGNAL) CHECK(dr > 0, "signal mode: the faulting thread never reclaimed for itself");
    attune_free(a);
    return ev ? (double)bg / ev : -1;
}

int main(void) {
    double sig = evictor_share(ATTUNE_FAULT_SIGNAL), thr = evictor_share(ATTUNE_FAULT_THREAD);
    CHECK(sig >= 0 && sig <= 0.05, "signal delivery: the evictor evicted %.1f%% (the faulting thread should)", sig * 100);
    CHECK(thr >= 0.3, "thread delivery: the evictor evicted only %.1f%%", thr * 100);
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
