/* fork while another thread discards part of a chunk: the discard writes zeros over the
 * chunk's edge, which faults when the chunk is in a far tier; it must do so outside the
 * fork gate, or the fork waits for it while the handler thread waits for the gate (5 s,
 * then a child without its managed memory). Found by the soak (tests/stress/soak.c);
 * before the fix about one fork in 15 failed here. */
#define _GNU_SOURCE
#include <attune.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include "check.h"

#define PAGE 4096
static uint64_t *a; static size_t len = 32 << 20, chunk = 64 << 10;
static atomic_int stop;
static atomic_ulong discards;

static void *discarder(void *arg) {
    (void)arg;
    uint64_t x = 12345;
    while (!stop) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t c = x % (len / chunk);
        /* One page in the middle of a chunk: a partial discard, written with zeros. */
        uint64_t *p = a + (c * chunk + PAGE * (1 + x % 14)) / 8;
        if (attune_discard(p, PAGE) == 0) discards++;
        p[0] = 1;      /* keep the chunk dirty, so it is evicted and fetched again */
    }
    return NULL;
}

int main(void) {
    attune_alloc_opts o; attune_alloc_opts_init(&o);
    o.chunk_size = chunk; o.fault_mode = ATTUNE_FAULT_THREAD;
    a = attune_alloc(len, &o);
    CHECK(a != NULL, "alloc: %s", attune_last_error()); if (!a) CHECK_DONE();
    for (size_t i = 0; i < len / 8; i++) a[i] = 7;
    pthread_t th; pthread_create(&th, 0, discarder, 0);
    int forks = (int)env_size("FORKS", 60), failed = 0;
    for (int i = 0; i < forks; i++) {
        pid_t c = fork();
        if (c == 0) _exit(a[(size_t)i * 4099 % (len / 8)] > 7); /* a managed read in the child */
        int st = 0;
        waitpid(c, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
        struct timespec ts = {0, 20 * 1000 * 1000}; nanosleep(&ts, 0);
    }
    stop = 1; pthread_join(th, 0);
    CHECK(failed == 0, "%d of %d forked children failed", failed, forks);
    CHECK(discards > 100, "only %lu discards", (unsigned long)discards);
    printf("fork_discard: %d forks, %lu partial discards beside them\n", forks, (unsigned long)discards);
    free_TM(a);
    CHECK_DONE();
}
