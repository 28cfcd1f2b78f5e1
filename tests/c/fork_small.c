/* fork while other threads allocate and free small blocks. The small allocator's state
 * (mimalloc's heaps and locks, the arenas' live-block map) must be consistent at the
 * instant of every fork, or a child hangs on a lock held by a thread it does not have, or
 * loses blocks. Two threads allocate and free blocks of 16 B to 256 KiB in four classes
 * (mimalloc's small, medium and large paths, which take its locks) and check each block's
 * content when freeing it; the main thread forks 40 times meanwhile. Each child, under an
 * alarm, checks a block the parent wrote before the threads started, allocates, checks
 * and frees 2,000 blocks of its own, frees the inherited block and a double free of it is
 * refused. */
#define _GNU_SOURCE
#include <attune.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include "check.h"

enum { FORKS = 40, LIVE = 64, CHILD_BLOCKS = 2000 };
static const int classes[] = {0, ATTUNE_LAT, ATTUNE_CAP, ATTUNE_BW};
static volatile int stop;

struct worker { int id; long ops; int bad; };

static size_t pick_size(uint64_t *x) {
    *x ^= *x << 13; *x ^= *x >> 7; *x ^= *x << 17;
    unsigned r = *x % 100;
    return r < 80 ? 16 + *x % 1024 : r < 97 ? 1024 + *x % 65536 : 65536 + *x % (192 << 10);
}

static void *run(void *arg) {
    struct worker *w = arg;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(w->id + 7);
    unsigned char *p[LIVE] = {0}; size_t sz[LIVE] = {0}; unsigned char fill[LIVE] = {0};
    for (long i = 0; !stop; i++) {
        int k = i % LIVE;
        if (p[k]) {
            for (size_t j = 0; j < sz[k]; j += 61) w->bad += p[k][j] != fill[k];
            w->bad += p[k][sz[k] - 1] != fill[k];
            if (attune_free(p[k]) != 0) w->bad++;
        }
        sz[k] = pick_size(&x);
        fill[k] = (unsigned char)(i * 31 + w->id);
        p[k] = allocate_TM(sz[k], classes[(i + w->id) % 4]);
        if (!p[k]) { w->bad++; continue; }
        memset(p[k], fill[k], sz[k]);
        w->ops++;
    }
    for (int k = 0; k < LIVE; k++) if (p[k]) attune_free(p[k]);
    return NULL;
}

static int child(uint64_t *inherited) {
    alarm(20); /* a lock left held by a parent thread would hang here */
    int bad = 0;
    for (int i = 0; i < 64; i++) bad += inherited[i] != mix64(5000 + i);
    uint64_t x = 424242;
    for (int i = 0; i < CHILD_BLOCKS; i++) {
        size_t n = pick_size(&x);
        unsigned char *q = allocate_TM(n, classes[i % 4]);
        if (!q) return 2;
        memset(q, i & 0xff, n);
        bad += q[0] != (i & 0xff) || q[n - 1] != (i & 0xff);
        if (attune_free(q) != 0) bad++;
    }
    if (attune_free(inherited) != 0) bad++;
    errno = 0;
    if (attune_free(inherited) != -1 || errno != EINVAL) bad++;
    return bad ? 1 : 0;
}

int main(void) {
    uint64_t *inherited = allocate_TM(64 * sizeof(uint64_t), ATTUNE_LAT);
    CHECK(inherited != NULL, "small alloc: %s", attune_last_error());
    if (!inherited) CHECK_DONE();
    for (int i = 0; i < 64; i++) inherited[i] = mix64(5000 + i);
    struct worker w[2] = {{.id = 0}, {.id = 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run, &w[i]);
    int ok = 0;
    for (int f = 0; f < FORKS; f++) {
        struct timespec d = {0, 2000000}; nanosleep(&d, NULL);
        pid_t pid = fork();
        if (pid == 0) _exit(child(inherited));
        CHECK(pid > 0, "fork %d", f);
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x (signal %d: hung on a lock if 14)", f, st, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    stop = 1;
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    CHECK(w[0].bad == 0 && w[1].bad == 0, "blocks corrupted or refused in the parent: %d, %d", w[0].bad, w[1].bad);
    CHECK(w[0].ops > 1000 && w[1].ops > 1000, "the threads allocated meanwhile: %ld, %ld", w[0].ops, w[1].ops);
    for (int i = 0; i < 64; i++) CHECK(inherited[i] == mix64(5000 + i), "inherited block word %d in the parent", i);
    CHECK(attune_free(inherited) == 0, "parent's free");
    printf("fork_small: %d of %d children fine; %ld + %ld allocations in the parent's threads meanwhile\n", ok, FORKS, w[0].ops, w[1].ops);
    CHECK_DONE();
}
